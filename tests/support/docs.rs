//! What README.md and docs/ quote: each quote is compared with the text without whitespace, so
//! a line break or an indentation may fall anywhere inside it.

/// The text of `doc`, a path from the crate root.
pub fn read(doc: &str) -> String {
    std::fs::read_to_string(format!("{}/{doc}", env!("CARGO_MANIFEST_DIR"))).unwrap_or_else(|e| panic!("{doc}: {e}"))
}

fn without_whitespace(text: &str) -> String {
    text.split_whitespace().collect()
}

/// Fails unless `doc` quotes every one of `quotes` (whitespace aside).
pub fn assert_quotes(doc: &str, quotes: &[String]) {
    let text = without_whitespace(&read(doc));
    for quote in quotes {
        assert!(
            text.contains(&without_whitespace(quote)),
            "{doc} does not quote '{quote}'"
        );
    }
}
