//! Argument parsers shared by subcommands, so bad values are usage errors instead of
//! panics further down.

/// A number of seconds (`--timeout`): finite, not negative, and small enough for a
/// `Duration`.
pub fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || v < 0.0 || std::time::Duration::try_from_secs_f64(v).is_err() {
        return Err(format!(
            "`{s}` is not a number of seconds (0 or more, finite)"
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_are_finite_and_not_negative() {
        assert_eq!(super::seconds("1.5"), Ok(1.5));
        assert_eq!(super::seconds("0"), Ok(0.0));
        for bad in ["-1", "inf", "nan", "1e30", "soon", ""] {
            assert!(super::seconds(bad).is_err(), "{bad}");
        }
    }
}
