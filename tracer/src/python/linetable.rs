//! A code object's line table (`co_linetable`): which source line each instruction came from.
//! An instruction offset (in 2-byte code units from the start of the bytecode) is mapped by
//! walking the table's entries.
//!
//! 3.10 ([`Format::Pairs`]): byte pairs, the bytes the entry covers (unsigned) and its line's
//! change (signed; -128: no line).
//!
//! 3.11+ ([`Format::Locations`]): entries each covering 1–8 code units.
//!
//! Entry: a first byte `1 kkkk nnn` (kind k, n+1 code units), then by kind:
//! - 15: no location; 14: long form (line delta as a signed varint, end-line delta, column+1,
//!   end-column+1 as varints); 13: line only (signed varint delta); 10–12: one line, delta k−10,
//!   then start and end columns (a byte each); 0–9: same line, one byte of columns.
//!
//! Varints are little-endian 6-bit groups, 0x40 marking that another follows; a signed varint
//! keeps the sign in its lowest bit.

/// The two formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Pairs,
    Locations,
}

/// The line of the instruction at `offset` code units, or None when the table says it has no
/// location (or the offset is past the table).
pub fn line_at(format: Format, table: &[u8], first_line: u32, offset: u32) -> Option<u32> {
    match format {
        Format::Pairs => pairs(table, first_line, offset),
        Format::Locations => locations(table, first_line, offset),
    }
}

fn pairs(table: &[u8], first_line: u32, offset: u32) -> Option<u32> {
    let byte = u64::from(offset) * 2;
    let (mut line, mut end) = (i64::from(first_line), 0u64);
    for pair in table.as_chunks::<2>().0 {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let here = (delta != -128).then(|| {
            line += i64::from(delta);
            line
        });
        if (start..end).contains(&byte) {
            return here.and_then(|l| u32::try_from(l).ok());
        }
    }
    None
}

fn locations(table: &[u8], first_line: u32, offset: u32) -> Option<u32> {
    let mut line = i64::from(first_line);
    let mut at = 0u32;
    let mut i = 0usize;
    while i < table.len() {
        let head = table[i];
        if head & 0x80 == 0 {
            // Not at an entry's start: a corrupt or foreign table.
            return None;
        }
        i += 1;
        let kind = (head >> 3) & 0x0f;
        let units = u32::from(head & 0x07) + 1;
        let delta = match kind {
            15 => None,
            14 => {
                let d = svarint(table, &mut i)?;
                for _ in 0..3 {
                    varint(table, &mut i)?;
                }
                Some(d)
            }
            13 => Some(svarint(table, &mut i)?),
            10..=12 => {
                i += 2;
                Some(i64::from(kind) - 10)
            }
            _ => {
                i += 1;
                Some(0)
            }
        };
        if let Some(d) = delta {
            line += d;
        }
        if offset < at + units {
            return delta.and_then(|_| u32::try_from(line).ok());
        }
        at += units;
    }
    None
}

fn varint(table: &[u8], i: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let b = *table.get(*i)?;
        *i += 1;
        value |= u64::from(b & 0x3f) << shift;
        if b & 0x40 == 0 {
            return Some(value);
        }
        shift += 6;
        if shift > 60 {
            return None;
        }
    }
}

fn svarint(table: &[u8], i: &mut usize) -> Option<i64> {
    let u = varint(table, i)?;
    let magnitude = (u >> 1) as i64;
    Some(if u & 1 == 1 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code object of a module compiled by each interpreter on the machine: the line of
    /// each code unit as `co_lines()` gives it, against the decoder's.
    #[test]
    fn lines_match_the_interpreters_own() {
        for (version, python) in crate::python::interpreters() {
            let format = crate::python::version::format_of(version).unwrap();
            let checked = lines_match(&python, format);
            assert!(checked > 100, "{python}: {checked} instructions checked");
        }
    }

    fn lines_match(python: &str, format: Format) -> usize {
        const DUMP: &str = r#"
src = '''
def f(a, b):
    x = [i * 2
         for i in range(a)]
    if b:
        raise ValueError(
            "long "
            "message")
    return {k: v for k, v in zip(x, x)}

class C:
    def m(self):
        try:
            return 1 / 0
        except ZeroDivisionError:
            pass
        finally:
            y = 3
''' + '\n' * 300 + '''
def far():
    return [0] * 10
'''
def walk(co):
    yield co
    for c in co.co_consts:
        if hasattr(c, 'co_lines'):
            yield from walk(c)
for co in walk(compile(src, 'm.py', 'exec')):
    lines = ';'.join(f'{s},{e},{-1 if l is None else l}' for s, e, l in co.co_lines())
    print(co.co_firstlineno, co.co_linetable.hex(), lines)
"#;
        let out = std::process::Command::new(python)
            .args(["-c", DUMP])
            .output()
            .expect("the interpreter runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut checked = 0;
        for row in text.lines() {
            let mut parts = row.split(' ');
            let first: u32 = parts.next().unwrap().parse().unwrap();
            let hex = parts.next().unwrap();
            let table: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            for range in parts
                .next()
                .unwrap_or("")
                .split(';')
                .filter(|r| !r.is_empty())
            {
                let v: Vec<i64> = range.split(',').map(|x| x.parse().unwrap()).collect();
                let want = u32::try_from(v[2]).ok();
                for byte in (v[0]..v[1]).step_by(2) {
                    assert_eq!(
                        line_at(format, &table, first, byte as u32 / 2),
                        want,
                        "{python}: {row} at {byte}"
                    );
                    checked += 1;
                }
            }
        }
        checked
    }

    #[test]
    fn varints_and_kinds() {
        // Long form (14): +300 lines as a signed varint (600 = 0b1001011000: 0x58|0x40, 0x09).
        let table = [0x80 | (14 << 3), 0x58 | 0x40, 0x09, 0, 1, 1];
        assert_eq!(line_at(Format::Locations, &table, 10, 0), Some(310));
        // No location (15) for two units, then one line down (11), one unit.
        let table = [0x80 | (15 << 3) | 1, 0x80 | (11 << 3), 4, 8];
        assert_eq!(line_at(Format::Locations, &table, 5, 1), None);
        assert_eq!(line_at(Format::Locations, &table, 5, 2), Some(6));
        assert_eq!(
            line_at(Format::Locations, &table, 5, 3),
            None,
            "past the table"
        );
        // Negative delta (13): svarint 3 = -1.
        assert_eq!(
            line_at(Format::Locations, &[0x80 | (13 << 3), 3], 7, 0),
            Some(6)
        );
    }

    #[test]
    fn pairs_with_no_line_and_negative_deltas() {
        // 4 bytes on line 10+2, 2 bytes with no line, 6 bytes one line up (11).
        let table = [4, 2, 2, 0x80, 6, 0xff];
        let at = |unit| line_at(Format::Pairs, &table, 10, unit);
        assert_eq!(
            (at(0), at(1), at(2), at(3), at(5), at(6)),
            (Some(12), Some(12), None, Some(11), Some(11), None)
        );
    }
}
