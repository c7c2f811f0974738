//! pprof export: the report's stacks as a `perftools.profiles.Profile` (profile.proto of
//! github.com/google/pprof), gzipped, the format go tool pprof, Pyroscope and Parca read.
//! Values per sample: inuse_space (bytes) and inuse_objects (blocks); labels: pid, kind, verdict.

use std::{collections::HashMap, io::Write as _};

use prost::Message;

use crate::report::{Report, StackReport};
use crate::symbolize::SymFrame;

#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// Builds the profile, deduplicating strings, mappings (one per module), locations (module and
/// offset) and functions (name and file).
#[derive(Default)]
struct Builder {
    p: Profile,
    strings: HashMap<String, i64>,
    mappings: HashMap<String, u64>,
    locations: HashMap<(String, String), u64>,
    functions: HashMap<(String, Option<String>), u64>,
}

impl Builder {
    fn new() -> Self {
        let mut b = Self::default();
        b.s("");
        b
    }

    fn s(&mut self, text: &str) -> i64 {
        if let Some(&i) = self.strings.get(text) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(text.to_owned());
        self.strings.insert(text.to_owned(), i);
        i
    }

    fn mapping(&mut self, module: &str) -> u64 {
        if let Some(&id) = self.mappings.get(module) {
            return id;
        }
        let id = self.p.mapping.len() as u64 + 1;
        let filename = self.s(module);
        self.p.mapping.push(Mapping {
            id,
            filename,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            ..Mapping::default()
        });
        self.mappings.insert(module.to_owned(), id);
        id
    }

    fn function(&mut self, name: &str, file: Option<&str>) -> u64 {
        let key = (name.to_owned(), file.map(str::to_owned));
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        let name = self.s(name);
        let filename = file.map_or(0, |f| self.s(f));
        self.p.function.push(Function {
            id,
            name,
            system_name: name,
            filename,
            start_line: 0,
        });
        self.functions.insert(key, id);
        id
    }

    fn location(&mut self, f: &SymFrame) -> u64 {
        let module = f.module.as_deref().unwrap_or("[unknown]");
        let key = (module.to_owned(), f.offset.clone());
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.p.location.len() as u64 + 1;
        let mapping_id = self.mapping(module);
        let name = f
            .function
            .clone()
            .unwrap_or_else(|| format!("{module}+{}", f.offset));
        let function_id = self.function(&name, f.file.as_deref());
        self.p.location.push(Location {
            id,
            mapping_id,
            address: parse_hex(&f.offset),
            line: vec![Line {
                function_id,
                line: f.line.map_or(0, i64::from),
            }],
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }

    fn label(&mut self, key: &str, value: &str) -> Label {
        Label {
            key: self.s(key),
            str: self.s(value),
            ..Label::default()
        }
    }

    fn sample(&mut self, st: &StackReport) {
        let location_id = st.frames.iter().map(|f| self.location(f)).collect();
        let mut label = vec![
            Label {
                key: self.s("pid"),
                num: i64::from(st.pid),
                ..Label::default()
            },
            self.label("kind", st.kind.name()),
        ];
        if let Some(v) = &st.verdict {
            label.push(self.label("verdict", v.verdict.name()));
        }
        self.p.sample.push(Sample {
            location_id,
            value: vec![st.bytes as i64, st.blocks as i64],
            label,
        });
    }
}

fn parse_hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or(0)
}

/// The profile of `r`'s stacks.
pub fn profile(r: &Report, time_unix_ns: i64) -> Profile {
    let mut b = Builder::new();
    let space = (b.s("inuse_space"), b.s("bytes"));
    let objects = (b.s("inuse_objects"), b.s("count"));
    b.p.sample_type = vec![
        ValueType {
            r#type: space.0,
            unit: space.1,
        },
        ValueType {
            r#type: objects.0,
            unit: objects.1,
        },
    ];
    b.p.default_sample_type = space.0;
    for st in &r.stacks {
        b.sample(st);
    }
    b.p.time_nanos = time_unix_ns;
    b.p.duration_nanos = (r.elapsed_s * 1e9) as i64;
    let comment = b.s("leaktracer: outstanding memory per stack");
    b.p.comment = vec![comment];
    b.p
}

/// The profile of `r`, encoded and gzipped.
pub fn encode(r: &Report, time_unix_ns: i64) -> Vec<u8> {
    let raw = profile(r, time_unix_ns).encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(&raw);
    gz.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;
    use crate::report::synthetic::{ledger_with, report_of};

    #[test]
    fn stacks_become_samples_with_shared_locations_and_strings() {
        let (ledger, analysis) = ledger_with(3, 5);
        let r = report_of(&ledger, &analysis, 3);
        let p = profile(&r, 7);
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.sample.len(), 3);
        assert_eq!(
            p.sample[0].value,
            vec![r.stacks[0].bytes as i64, r.stacks[0].blocks as i64]
        );
        // Three distinct frames per stack, none shared: 9 locations; one unknown module.
        assert_eq!(p.location.len(), 9);
        assert_eq!(p.mapping.len(), 1);
        let strings: std::collections::HashSet<_> = p.string_table.iter().collect();
        assert_eq!(strings.len(), p.string_table.len(), "strings are unique");
        let leaf = &p.location[p.sample[0].location_id[0] as usize - 1];
        assert_eq!(leaf.address, parse_hex(&r.stacks[0].frames[0].offset));
        let gz = encode(&r, 7);
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut raw)
            .unwrap();
        assert_eq!(Profile::decode(&raw[..]).unwrap(), p);
    }
}
