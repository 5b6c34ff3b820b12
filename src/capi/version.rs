//! Version numbers. The header's MUON_VERSION_* macros are written by build.rs from the same
//! Cargo.toml fields; a test checks that they agree.

const fn parse(text: &str) -> u32 {
    let bytes = text.as_bytes();
    let mut value = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}

/// Major version (Cargo.toml).
pub(crate) const VERSION_MAJOR: u32 = parse(env!("CARGO_PKG_VERSION_MAJOR"));
/// Minor version (Cargo.toml).
pub(crate) const VERSION_MINOR: u32 = parse(env!("CARGO_PKG_VERSION_MINOR"));
/// Patch version (Cargo.toml).
pub(crate) const VERSION_PATCH: u32 = parse(env!("CARGO_PKG_VERSION_PATCH"));
/// `MAJOR*10000 + MINOR*100 + PATCH`, as MUON_VERSION_CODE in the header.
pub(crate) const MUON_VERSION_CODE: u32 = VERSION_MAJOR * 10_000 + VERSION_MINOR * 100 + VERSION_PATCH;

/// @brief The library's version as MAJOR*10000 + MINOR*100 + PATCH (= MUON_VERSION_CODE of
///        the header it was built with).
#[unsafe(no_mangle)]
pub extern "C" fn muon_get_version() -> u32 {
    MUON_VERSION_CODE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_macro(header: &str, name: &str) -> u32 {
        let line = header
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("{name} missing from include/muon_opt.h"));
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    }

    #[test]
    fn header_version_macros_match_cargo_toml() {
        let header = include_str!("../../include/muon_opt.h");
        let cargo: Vec<u32> = env!("CARGO_PKG_VERSION")
            .split('.')
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(header_macro(header, "MUON_VERSION_MAJOR"), cargo[0]);
        assert_eq!(header_macro(header, "MUON_VERSION_MINOR"), cargo[1]);
        assert_eq!(header_macro(header, "MUON_VERSION_PATCH"), cargo[2]);
        let code = cargo[0] * 10_000 + cargo[1] * 100 + cargo[2];
        assert_eq!(header_macro(header, "MUON_VERSION_CODE"), code);
        assert_eq!(muon_get_version(), code);
    }
}
