//! Sizes as people write them in a config file ("512MiB", "1G", "64 KiB", "1000000") and
//! as shade says them back in one line ("512 MiB", "1 GiB").

/// Bytes in a kibibyte, mebibyte, gibibyte and tebibyte.
const KI: u64 = 1 << 10;
const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;
const TI: u64 = 1 << 40;

/// Parses a size: a whole number with an optional unit. `K`, `M`, `G`, `T` and `KiB` …
/// `TiB` are binary (as `ulimit`, `free` and tmpfs's `size=` read them), `KB` … `TB`
/// decimal, `B` or nothing bytes. Case does not matter, a space may separate number and
/// unit. `Err` says what is wrong, in the user's terms.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "{text:?} is not a size (write e.g. 512MiB, 1G or a number of bytes)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?} is too large a size"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KI,
        "m" | "mib" => MI,
        "g" | "gib" => GI,
        "t" | "tib" => TI,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB or TB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{text:?} is too large a size"))
}

/// A size in the largest binary unit it is a whole (or tenth) multiple of, for one-line
/// messages: 536870912 → "512 MiB", 1073741824 → "1 GiB", 1536 → "1.5 KiB", 100 → "100 bytes".
pub fn format_size(bytes: u64) -> String {
    for (unit, size) in [("TiB", TI), ("GiB", GI), ("MiB", MI), ("KiB", KI)] {
        if bytes >= size {
            if bytes.is_multiple_of(size) {
                return format!("{} {unit}", bytes / size);
            }
            let tenths = (u128::from(bytes) * 10 + u128::from(size) / 2) / u128::from(size);
            return format!("{}.{} {unit}", tenths / 10, tenths % 10);
        }
    }
    if bytes == 1 {
        "1 byte".into()
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1gib"), Ok(1 << 30));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size(" 7B "), Ok(7));
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("3 parsecs").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn sizes_are_said_in_the_largest_fitting_unit() {
        assert_eq!(format_size(512 << 20), "512 MiB");
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(100), "100 bytes");
        assert_eq!(format_size(1), "1 byte");
        for s in ["512MiB", "1GiB", "64KiB", "3TiB"] {
            assert_eq!(
                parse_size(&format_size(parse_size(s).unwrap())),
                parse_size(s)
            );
        }
    }
}
