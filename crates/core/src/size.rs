/// Parses a byte size such as `300MiB`, `4GiB`, `64 MB` or `1048576`.
///
/// ```
/// assert_eq!(streambatch_core::parse_size("300MiB"), Ok(300 << 20));
/// assert!(streambatch_core::parse_size("lots").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(n) = text.parse::<u64>() {
        return Ok(n);
    }
    text.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("`{text}` is not a byte size (like 300MiB or 4GiB): {e}"))
}

/// Formats a byte count for people: `1.5 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    bytesize::ByteSize(bytes).display().iec().to_string()
}
