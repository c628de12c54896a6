//! The `#[tool]` attribute of `ferrograph-tools` (use it from there).
//!
//! On an `async fn NAME(args: Args) -> Result<T, E>` (optionally with a second `&ToolContext`
//! or `ToolContext` parameter) it keeps the fn and adds `fn NAME_tool() -> FnTool`, a tool
//! named `NAME` whose description is the fn's doc comment and whose argument schema is
//! `Args`'s JSON Schema. `#[tool(name = "...", description = "...")]` overrides both.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::{parse_macro_input, FnArg, ItemFn, LitStr, Type};

/// Turns an async fn with a typed argument struct into a tool; see the crate docs.
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut name: Option<LitStr> = None;
    let mut description: Option<LitStr> = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("name") {
            name = Some(meta.value()?.parse()?);
            Ok(())
        } else if meta.path.is_ident("description") {
            description = Some(meta.value()?.parse()?);
            Ok(())
        } else {
            Err(meta.error("unknown #[tool] option; expected `name` or `description`"))
        }
    });
    parse_macro_input!(attr with parser);
    let func = parse_macro_input!(item as ItemFn);
    match expand(func, name, description) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn tools_path() -> TokenStream2 {
    use proc_macro_crate::{crate_name, FoundCrate};
    match crate_name("ferrograph-tools") {
        Ok(FoundCrate::Name(name)) => {
            let ident = syn::Ident::new(&name, Span::call_site());
            quote!(::#ident)
        }
        _ => quote!(::ferrograph_tools),
    }
}

fn doc_text(func: &ItemFn) -> String {
    let mut lines = Vec::new();
    for attr in &func.attrs {
        if !attr.path().is_ident("doc") {
            continue;
        }
        if let syn::Meta::NameValue(nv) = &attr.meta {
            if let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
            {
                let v = s.value();
                lines.push(v.strip_prefix(' ').unwrap_or(&v).trim_end().to_string());
            }
        }
    }
    lines.join("\n").trim().to_string()
}

fn expand(
    func: ItemFn,
    name: Option<LitStr>,
    description: Option<LitStr>,
) -> syn::Result<TokenStream2> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new_spanned(
            sig.fn_token,
            "#[tool] needs an `async fn`",
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &sig.generics,
            "#[tool] functions cannot be generic",
        ));
    }
    let mut inputs = sig.inputs.iter();
    let arg_ty: Type = match inputs.next() {
        Some(FnArg::Typed(pt)) => (*pt.ty).clone(),
        Some(FnArg::Receiver(r)) => {
            return Err(syn::Error::new_spanned(
                r,
                "#[tool] functions cannot take `self`",
            ))
        }
        None => {
            return Err(syn::Error::new_spanned(
                sig,
                "#[tool] functions take an argument struct (use an empty struct for none)",
            ))
        }
    };
    let ctx_arg = match inputs.next() {
        None => None,
        Some(FnArg::Typed(pt)) => Some(matches!(&*pt.ty, Type::Reference(_))),
        Some(other) => {
            return Err(syn::Error::new_spanned(
                other,
                "the second parameter of a #[tool] function is its ToolContext",
            ))
        }
    };
    if let Some(extra) = inputs.next() {
        return Err(syn::Error::new_spanned(
            extra,
            "#[tool] functions take the argument struct and optionally a ToolContext",
        ));
    }
    let fn_name = &sig.ident;
    let tool_name = name.map(|n| n.value()).unwrap_or_else(|| {
        let s = fn_name.to_string();
        s.strip_prefix("r#").unwrap_or(&s).to_string()
    });
    let desc = match description {
        Some(d) => d.value(),
        None => doc_text(&func),
    };
    let vis = &func.vis;
    let ctor = format_ident!("{}_tool", fn_name);
    let krate = tools_path();
    let call = match ctx_arg {
        None => quote!(#fn_name(args).await),
        Some(true) => quote!(#fn_name(args, &ctx).await),
        Some(false) => quote!(#fn_name(args, ctx).await),
    };
    let ctor_doc = format!("The tool `{tool_name}` (runs [`{fn_name}`]).");
    Ok(quote! {
        #func

        #[doc = #ctor_doc]
        #vis fn #ctor() -> #krate::FnTool {
            #krate::FnTool::with_context(
                #tool_name,
                #desc,
                |args: #arg_ty, ctx: #krate::ToolContext| async move {
                    let _ = &ctx;
                    #call
                },
            )
        }
    })
}
