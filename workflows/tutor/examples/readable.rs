//! Prints a Markdown file as the tutor reads it (`cargo run -p ferrograph-tutor --example
//! readable -- FILE`): what its cleaning keeps of a README written for a web page.
#![allow(clippy::print_stdout)]

fn main() -> std::io::Result<()> {
    for path in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&path)?;
        println!("{}", ferrograph_tutor::clean::readable(&text));
    }
    Ok(())
}
