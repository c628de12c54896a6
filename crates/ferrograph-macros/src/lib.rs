//! Derive macros for ferrograph.
//!
//! `#[derive(State)]` implements `ferrograph_core::State` for a struct with named fields and
//! generates its update type (`<Name>Update`): one `Option` per field, a builder method per
//! field, and a conversion into a node output.
//!
//! Field rules, with `#[reducer(...)]`:
//! - nothing or `overwrite`: the written value replaces the old one; two writers in one step
//!   are a conflict;
//! - `append`: `Vec<T>` fields, written items are appended;
//! - `add`: numbers, the written value is added;
//! - `messages`: `Vec<Message>` fields with the messages rule;
//! - `with = path`: a function `fn(&mut T, U)`; `U` is the field type unless `update = Type`
//!   names another;
//! - `using = Type`: any type implementing `Reducer<T>`.
//!
//! Struct options, with `#[state(...)]`: `version = N` (schema version, default 1),
//! `crate = path` (where `ferrograph_core` lives, normally found automatically).

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::{parse_macro_input, spanned::Spanned, Data, DeriveInput, Fields, LitInt, Path, Type};

/// Derives `State` and generates the update type. See the crate documentation.
#[proc_macro_derive(State, attributes(reducer, state))]
pub fn derive_state(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(input) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

enum Rule {
    Builtin(&'static str),
    With { func: Path, update: Option<Type> },
    Using(Type),
}

struct FieldSpec {
    ident: syn::Ident,
    ty: Type,
    rule: Rule,
}

fn core_path(explicit: Option<Path>) -> TokenStream2 {
    if let Some(p) = explicit {
        return quote!(#p);
    }
    use proc_macro_crate::{crate_name, FoundCrate};
    match crate_name("ferrograph-core") {
        Ok(FoundCrate::Itself) => quote!(::ferrograph_core),
        Ok(FoundCrate::Name(name)) => {
            let ident = syn::Ident::new(&name, Span::call_site());
            quote!(::#ident)
        }
        Err(_) => match crate_name("ferrograph") {
            Ok(FoundCrate::Name(name)) => {
                let ident = syn::Ident::new(&name, Span::call_site());
                quote!(::#ident::core)
            }
            _ => quote!(::ferrograph::core),
        },
    }
}

fn parse_rule(field: &syn::Field) -> syn::Result<Rule> {
    let mut rule = None;
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("reducer")) {
        let mut func: Option<Path> = None;
        let mut update: Option<Type> = None;
        let mut using: Option<Type> = None;
        let mut builtin: Option<&'static str> = None;
        attr.parse_nested_meta(|meta| {
            let name = meta
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            match name.as_str() {
                "overwrite" => builtin = Some("Overwrite"),
                "append" => builtin = Some("Append"),
                "add" => builtin = Some("Add"),
                "messages" => builtin = Some("Messages"),
                "with" => func = Some(meta.value()?.parse()?),
                "update" => update = Some(meta.value()?.parse()?),
                "using" => using = Some(meta.value()?.parse()?),
                _ => {
                    return Err(meta.error(
                        "unknown merge rule; expected overwrite, append, add, messages, \
                         with = path, update = Type or using = Type",
                    ))
                }
            }
            Ok(())
        })?;
        let parsed = match (builtin, func, using) {
            (Some(b), None, None) if update.is_none() => Rule::Builtin(b),
            (None, Some(func), None) => Rule::With { func, update },
            (None, None, Some(t)) if update.is_none() => Rule::Using(t),
            _ => {
                return Err(syn::Error::new(
                    attr.span(),
                    "give exactly one merge rule per field",
                ))
            }
        };
        if rule.is_some() {
            return Err(syn::Error::new(
                attr.span(),
                "duplicate #[reducer] attribute",
            ));
        }
        rule = Some(parsed);
    }
    Ok(rule.unwrap_or(Rule::Builtin("Overwrite")))
}

fn expand(input: DeriveInput) -> syn::Result<TokenStream2> {
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new(
            input.generics.span(),
            "#[derive(State)] does not support generic structs",
        ));
    }
    let mut version: Option<LitInt> = None;
    let mut krate: Option<Path> = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("state")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("version") {
                version = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("crate") {
                krate = Some(meta.value()?.parse()?);
            } else {
                return Err(meta.error("expected `version = N` or `crate = path`"));
            }
            Ok(())
        })?;
    }
    let core = core_path(krate);
    let fields = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(named) => &named.named,
            _ => {
                return Err(syn::Error::new(
                    input.span(),
                    "#[derive(State)] needs a struct with named fields",
                ))
            }
        },
        _ => {
            return Err(syn::Error::new(
                input.span(),
                "#[derive(State)] needs a struct with named fields",
            ))
        }
    };
    let mut specs = Vec::new();
    for f in fields {
        let ident = f
            .ident
            .clone()
            .ok_or_else(|| syn::Error::new(f.span(), "field without a name"))?;
        specs.push(FieldSpec {
            ident,
            ty: f.ty.clone(),
            rule: parse_rule(f)?,
        });
    }

    let name = &input.ident;
    let vis = &input.vis;
    let update_name = format_ident!("{}Update", name);
    let version = version.map(|v| quote!(#v)).unwrap_or(quote!(1));

    let mut update_fields = Vec::new();
    let mut setters = Vec::new();
    let mut apply_arms = Vec::new();
    let mut overwrite_arms = Vec::new();
    let mut empty_checks = Vec::new();
    let mut set_names = Vec::new();
    let mut merge_checks = Vec::new();
    let mut merge_arms = Vec::new();
    let mut overwrite_value_arms = Vec::new();
    let mut field_names = Vec::new();

    for spec in &specs {
        let ident = &spec.ident;
        let ty = &spec.ty;
        let fname = ident.to_string();
        let fname = fname.trim_start_matches("r#").to_string();
        field_names.push(fname.clone());
        let reducer = match &spec.rule {
            Rule::Builtin(rule) => {
                let r = format_ident!("{}", rule);
                Some(quote!(<#core::state::#r as #core::state::Reducer<#ty>>))
            }
            Rule::Using(r) => Some(quote!(<#r as #core::state::Reducer<#ty>>)),
            Rule::With { .. } => None,
        };
        let (update_ty, apply, fresh_apply, overwrite, combinable, combine) =
            match (reducer, &spec.rule) {
                (Some(reducer), _) => (
                    quote!(#reducer::Update),
                    quote!(#reducer::reduce(&mut self.#ident, v)),
                    quote!(#reducer::reduce(&mut fresh.#ident, v)),
                    quote!(#reducer::OVERWRITE),
                    quote!(#reducer::COMBINABLE),
                    quote!(#reducer::combine(a, b)),
                ),
                (None, Rule::With { func, update }) => {
                    let u = update.as_ref().map(|u| quote!(#u)).unwrap_or(quote!(#ty));
                    (
                        u,
                        quote!({ #func(&mut self.#ident, v); ::core::result::Result::Ok(()) }),
                        quote!({ #func(&mut fresh.#ident, v); ::core::result::Result::Ok(()) }),
                        quote!(false),
                        quote!(false),
                        quote!({
                            *a = b;
                        }),
                    )
                }
                (None, _) => {
                    return Err(syn::Error::new(
                        spec.ident.span(),
                        "internal error: a merge rule without its reducer",
                    ))
                }
            };
        overwrite_value_arms.push(quote! {
            if let ::core::option::Option::Some(v) = update.#ident {
                let r: ::core::result::Result<(), #core::state::ReducerError> = #fresh_apply;
                r.map_err(|e| e.in_field(#fname))?;
                ::core::mem::swap(&mut self.#ident, &mut fresh.#ident);
            }
        });
        merge_checks.push(quote! {
            if !(#combinable) && self.#ident.is_some() && later.#ident.is_some() {
                return ::core::result::Result::Err(later);
            }
        });
        merge_arms.push(quote! {
            match (&mut self.#ident, later.#ident) {
                (::core::option::Option::Some(a), ::core::option::Option::Some(b)) => #combine,
                (slot, ::core::option::Option::Some(b)) => *slot = ::core::option::Option::Some(b),
                (_, ::core::option::Option::None) => {}
            }
        });
        let doc = format!("Update for field `{fname}`.");
        update_fields.push(quote! {
            #[doc = #doc]
            #[serde(default)]
            pub #ident: ::core::option::Option<#update_ty>
        });
        let setter_doc = format!("Sets the update for field `{fname}`.");
        setters.push(quote! {
            #[doc = #setter_doc]
            #[must_use]
            pub fn #ident(mut self, value: impl ::core::convert::Into<#update_ty>) -> Self {
                self.#ident = ::core::option::Option::Some(value.into());
                self
            }
        });
        apply_arms.push(quote! {
            if let ::core::option::Option::Some(v) = update.#ident {
                let r: ::core::result::Result<(), #core::state::ReducerError> = #apply;
                r.map_err(|e| e.in_field(#fname))?;
            }
        });
        overwrite_arms.push(quote! {
            if #overwrite && update.#ident.is_some() {
                f(#fname);
            }
        });
        empty_checks.push(quote!(self.#ident.is_none()));
        set_names.push(quote! {
            if self.#ident.is_some() {
                out.push(#fname);
            }
        });
    }

    let update_doc = format!("Partial update of [`{name}`]: the fields a node sets.");
    let serde_path = quote!(#core::__private::serde).to_string().replace(' ', "");
    Ok(quote! {
        #[doc = #update_doc]
        #[derive(::core::clone::Clone, ::core::default::Default, ::core::fmt::Debug,
                 #core::__private::serde::Serialize, #core::__private::serde::Deserialize)]
        // Unknown fields are refused, not dropped: an input with a misspelt field would
        // otherwise run without it.
        #[serde(crate = #serde_path, deny_unknown_fields)]
        #vis struct #update_name {
            #(#update_fields,)*
        }

        impl #update_name {
            /// An update that sets nothing.
            #[must_use]
            pub fn new() -> Self {
                ::core::default::Default::default()
            }
            #(#setters)*
        }

        impl #core::state::StateUpdate for #update_name {
            fn is_empty(&self) -> bool {
                true #(&& #empty_checks)*
            }
            fn fields_set(&self) -> ::std::vec::Vec<&'static str> {
                let mut out = ::std::vec::Vec::new();
                #(#set_names)*
                out
            }
            #[allow(unused_variables)]
            fn merge(&mut self, later: Self) -> ::core::result::Result<(), Self> {
                #(#merge_checks)*
                #(#merge_arms)*
                ::core::result::Result::Ok(())
            }
        }

        impl #core::state::State for #name {
            type Update = #update_name;
            const SCHEMA_VERSION: u32 = #version;

            fn field_names() -> &'static [&'static str] {
                &[#(#field_names),*]
            }

            #[allow(unused_variables)]
            fn apply(&mut self, update: #update_name)
                -> ::core::result::Result<(), #core::state::ReducerError> {
                #(#apply_arms)*
                ::core::result::Result::Ok(())
            }

            #[allow(unused_variables)]
            fn overwritten_fields(update: &#update_name, f: &mut dyn FnMut(&'static str)) {
                #(#overwrite_arms)*
            }

            #[allow(unused_variables, unused_mut)]
            fn overwrite(&mut self, update: #update_name)
                -> ::core::result::Result<(), #core::state::ReducerError> {
                // Each set field becomes what its rule makes of the value from the field's
                // default; the old value is swapped out and dropped.
                let mut fresh = <Self as ::core::default::Default>::default();
                #(#overwrite_value_arms)*
                ::core::result::Result::Ok(())
            }
        }

        impl ::core::convert::From<#update_name> for #core::node::NodeOutput<#name> {
            fn from(update: #update_name) -> Self {
                #core::node::NodeOutput::update(update)
            }
        }
    })
}
