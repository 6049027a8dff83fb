//! GNU-style option parsing shared by the per-program checks (`programs`, `git`, `sed`):
//! which words are options, which take values, and unambiguous long-option prefixes.

use super::words::Arg;

/// All arguments as known strings, or the first one only known at run time.
pub(super) fn fixed<'a>(program: &str, args: &'a [Arg]) -> Result<Vec<&'a str>, String> {
    args.iter()
        .map(|a| {
            a.value.as_deref().ok_or_else(|| {
                format!(
                    "`{program}` argument `{}` is only known when the command runs",
                    a.text
                )
            })
        })
        .collect()
}

/// How a program's options take values, for [`options`].
pub(super) struct OptSpec {
    /// Short options whose value is the rest of the cluster or the next argument.
    pub short_arg: &'static str,
    /// Short options whose (optional) value can only be attached: `-i.bak`.
    pub short_optarg: &'static str,
    /// Long options whose value may be the next argument (`--key 2`).
    pub long_arg: &'static [&'static str],
}

/// One parsed command-line item.
#[derive(Debug, PartialEq)]
pub(super) enum Opt<'a> {
    Short(char, Option<&'a str>),
    Long(&'a str, Option<&'a str>),
    Operand(&'a str),
}

/// Does `--name` select the long option `full`? GNU getopt accepts any unambiguous prefix
/// (`--in` is `--in-place`); an ambiguous one is refused by the program, so matching every
/// prefix only errs on the safe side.
pub(super) fn long_is(name: &str, full: &str) -> bool {
    !name.is_empty() && full.starts_with(name)
}

/// Split arguments GNU-style: options anywhere (permutation) until `--`, clustered short
/// options, `--name=value`.
pub(super) fn options<'a>(args: &[&'a str], spec: &OptSpec) -> Vec<Opt<'a>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i];
        i += 1;
        if a == "--" {
            out.extend(args[i..].iter().map(|a| Opt::Operand(a)));
            break;
        }
        if let Some(long) = a.strip_prefix("--") {
            match long.split_once('=') {
                Some((name, value)) => out.push(Opt::Long(name, Some(value))),
                None => {
                    let takes = spec.long_arg.iter().any(|f| long_is(long, f));
                    let value = if takes { args.get(i).copied() } else { None };
                    if value.is_some() {
                        i += 1;
                    }
                    out.push(Opt::Long(long, value));
                }
            }
        } else if a.len() > 1 && a.starts_with('-') {
            let cluster = &a[1..];
            for (pos, c) in cluster.char_indices() {
                let rest = &cluster[pos + c.len_utf8()..];
                if spec.short_arg.contains(c) {
                    let value = if rest.is_empty() {
                        i += 1;
                        args.get(i - 1).copied()
                    } else {
                        Some(rest)
                    };
                    out.push(Opt::Short(c, value));
                    break;
                }
                if spec.short_optarg.contains(c) {
                    out.push(Opt::Short(c, (!rest.is_empty()).then_some(rest)));
                    break;
                }
                out.push(Opt::Short(c, None));
            }
        } else {
            out.push(Opt::Operand(a));
        }
    }
    out
}
