//! A stack's site: the one location `check`, the text report and the explorer name it by.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Mutex,
};

use super::StackReport;
use crate::symbolize::{PYTHON_MODULE, SymFrame};

/// Sources that are not the user's: a dependency's, the toolchain's, the system's, headers,
/// installed Python packages and Python's standard library, and the code PyTorch generates from
/// the user's (torch.compile's kernels and wrappers in its cache directory, torch.fx's modules).
const THIRD_PARTY: [&str; 11] = [
    "/.cargo/registry/",
    "/.cargo/git/",
    "/rustc/",
    "/include/",
    "/usr/",
    "site-packages/",
    "dist-packages/",
    "/lib/python3.",
    "<frozen ",
    "/torchinductor_",
    "<eval_with_key>",
];

impl StackReport {
    /// Whether the stack maps arenas of CPython's object allocator: Python objects, which no
    /// malloc probe sees, whatever the heap mode.
    pub fn python_arenas(&self) -> bool {
        crate::symbolize::python_arenas(self.kind, self.frames.iter())
    }

    /// Where the stack comes from, in one line, with file and line when known. With Python
    /// frames: the innermost Python frame of the user's code (outside installed packages and the
    /// standard library), else the innermost Python frame; never a function of the interpreter,
    /// an executable or libpython. Otherwise the first frame with a function in the program's own
    /// code (not in a shared library named lib*.so*, as libc, libstdc++, libtorch, libcudart; not
    /// from a header, a dependency's sources or the toolchain's), else its first frame with a
    /// function.
    pub fn site(&self) -> String {
        site_of(&self.frames)
    }
}

/// [`StackReport::site`] of these frames, innermost first.
pub fn site_of(frames: &[SymFrame]) -> String {
    let python = |f: &&SymFrame| f.module.as_deref() == Some(PYTHON_MODULE);
    let own = if frames.iter().any(|f| python(&f)) {
        let mut py = frames.iter().filter(python);
        py.clone().find(|f| !third_party(f)).or_else(|| py.next())
    } else {
        frames
            .iter()
            .find(|f| f.function.is_some() && !in_library(f) && !third_party(f))
    };
    own.into_iter()
        .chain(frames.iter())
        .find_map(|f| {
            let func = f.function.as_deref()?;
            Some(match (&f.file, f.line) {
                (Some(file), Some(line)) => {
                    format!(
                        "{func} ({}:{line})",
                        file.rsplit('/').next().unwrap_or(file)
                    )
                }
                _ => func.to_string(),
            })
        })
        .unwrap_or_else(|| "unknown stack".into())
}

/// A frame of a shared library (lib*.so*).
fn in_library(f: &SymFrame) -> bool {
    f.module.as_deref().is_some_and(|m| {
        let name = m.rsplit('/').next().unwrap_or(m);
        name.starts_with("lib") && name.contains(".so")
    })
}

/// A frame of code the user did not write (see [`THIRD_PARTY`]; headers; Python packages
/// installed anywhere, as `pip install --target DIR` does).
fn third_party(f: &SymFrame) -> bool {
    f.file
        .as_deref()
        .is_some_and(|file| third_party_file(file, f.module.as_deref() == Some(PYTHON_MODULE)))
}

/// Whether `file` (a Python source file where `python`) is code the user did not write.
fn third_party_file(file: &str, python: bool) -> bool {
    THIRD_PARTY.iter().any(|d| file.contains(d))
        || file.ends_with(".h")
        || file.ends_with(".hpp")
        || (python && installed(file))
}

/// Whether a stack's Python frames, `(file, function)` innermost first, were made while a
/// library's module was imported: inside the import system's `_find_and_load`, the frame the
/// import system runs is not a user's module body (a library's or the standard library's, or
/// not a module body at all), or no module runs yet (the import system's own objects: a
/// module's compiled code, its spec). What an import makes is the module's state, made once and
/// held as long as the module is loaded, however many imports a training loop's first steps
/// make. A user's module that runs its work when imported is still judged.
///
/// The frame the import system runs tells, not the innermost outside it: a module's body is
/// freed once run, and another code object made at its address before its stack was read (a
/// module's code just loaded from its compiled file, which names the directory it was
/// compiled in: pip's temporary one for a package installed with `--target`) reads as a
/// function of a file no one installed, the user's by its path. A frame whose code is not known
/// (`?`) tells nothing.
///
/// torch.compile's compilation counts as such an import: it generates modules from the user's
/// and loads them, and what it makes meanwhile (its graph caches, guards, configuration
/// snapshots) is held as long as they are, made again only when a function is compiled again
/// (a limited number of times). Its stacks hold a frame of the compiler itself
/// ([`TORCH_COMPILER`]), which a compiled function's calls do not.
pub fn made_by_import<'f>(python: impl IntoIterator<Item = (&'f str, &'f str)>) -> bool {
    const IMPORT_SYSTEM: &str = "<frozen importlib._bootstrap";
    let mut run = None;
    for (file, function) in python {
        if TORCH_COMPILER.iter().any(|c| file.ends_with(c)) {
            return true;
        }
        if file.starts_with(IMPORT_SYSTEM) {
            if function == "_find_and_load" {
                return run.is_none_or(|(m, f)| f != "<module>" || third_party_file(m, true));
            }
        } else {
            run = Some((file, function));
        }
    }
    false
}

/// Files of torch.compile's compiler: Dynamo's translation of the user's bytecode, AOTAutograd's
/// tracing, Inductor's compilation and its caches. None of them runs when a compiled function is
/// called (that goes through `eval_frame.py`, the runtime wrappers and the generated code).
const TORCH_COMPILER: [&str; 6] = [
    "torch/_dynamo/convert_frame.py",
    "torch/_dynamo/symbolic_convert.py",
    "torch/_functorch/aot_autograd.py",
    "torch/_inductor/compile_fx.py",
    "torch/_inductor/codecache.py",
    "torch/_inductor/graph.py",
];

/// Whether a Python source file lies in a directory packages were installed into: one of its
/// ancestors holds a `*.dist-info` or `*.egg-info` entry (pip's record of an installed
/// distribution), as `site-packages` does and as a `--target` directory on PYTHONPATH does.
/// Answers are kept per directory: a report asks for the same few directories again and again.
fn installed(file: &str) -> bool {
    static DIRS: Mutex<Option<HashMap<PathBuf, bool>>> = Mutex::new(None);
    let mut dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    let dirs = dirs.get_or_insert_with(HashMap::new);
    Path::new(file).ancestors().skip(1).any(|dir| {
        *dirs.entry(dir.to_path_buf()).or_insert_with(|| {
            std::fs::read_dir(dir).is_ok_and(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.ends_with(".dist-info") || name.ends_with(".egg-info")
                })
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frames of an import made from `importer`, running `module`'s body (when some), with
    /// `inner` inside it; innermost first.
    fn import<'f>(
        inner: &[(&'f str, &'f str)],
        module: Option<&'f str>,
        importer: &'f str,
    ) -> Vec<(&'f str, &'f str)> {
        let boot = "<frozen importlib._bootstrap>";
        let mut frames = inner.to_vec();
        frames.extend(module.map(|m| (m, "<module>")));
        frames.extend([
            (boot, "_call_with_frames_removed"),
            (
                "<frozen importlib._bootstrap_external>",
                "_LoaderBasics.exec_module",
            ),
            (boot, "_load_unlocked"),
            (boot, "_find_and_load_unlocked"),
            (boot, "_find_and_load"),
            (importer, "step"),
            (importer, "<module>"),
        ]);
        frames
    }

    #[test]
    fn what_a_librarys_import_makes_is_its_modules_state_and_the_users_work_is_not() {
        let torch = "/venv/lib/python3.12/site-packages/torch/_library/custom_ops.py";
        let user = "/home/u/train.py";
        let define = [(torch, "Library.define")];
        assert!(made_by_import(import(&define, Some(torch), user)));
        assert!(made_by_import(import(
            &[],
            Some("/usr/lib/python3.12/pydoc.py"),
            user
        )));
        // The import system's own objects: the module's compiled code, before it runs.
        let compile = [(
            "<frozen importlib._bootstrap_external>",
            "_compile_bytecode",
        )];
        assert!(made_by_import(import(&compile, None, user)));
        // A module body freed once run, as the report names it.
        assert!(made_by_import(import(&[("?", "<code 0x1>")], None, user)));
        // A user's module whose body trains when imported, and what its steps keep.
        let step = [(user, "train_step")];
        assert!(!made_by_import(import(
            &step,
            Some("/home/u/experiment.py"),
            user
        )));
        // A module's body read after it was freed, as a function of a module loaded since,
        // its code not yet given its file's path (the directory pip compiled it in); or as a
        // frame not known, with such a function inside it.
        let pip = "/tmp/pip-target-k8sto6u7/lib/python/sympy/integrals/meijerint.py";
        let reused = [(pip, "_create_lookup_table.<locals>.A1")];
        assert!(made_by_import(import(&reused, None, user)));
        let nested = [(pip, "_node_get"), ("?", "<code 0x2>")];
        assert!(made_by_import(import(&nested, None, user)));
        // No import at all, and the user's loop around a library's call.
        assert!(!made_by_import([(torch, "Library.define"), (user, "step")]));
        assert!(!made_by_import([]));
        // torch.compile's compilation (its stacks cut at the walk's depth, the user's line
        // beyond it), and a compiled function's call, which is the user's to judge.
        let torch = "/venv/lib/python3.12/site-packages/torch";
        let cache = format!("{torch}/_inductor/codecache.py");
        let config = format!("{torch}/utils/_config_module.py");
        let compiling = [
            (
                "/usr/lib/python3.12/base64.py",
                "_b32encode.<locals>.<listcomp>",
            ),
            ("/usr/lib/python3.12/base64.py", "b32encode"),
            (cache.as_str(), "sha256_hash"),
            (cache.as_str(), "FxGraphCache._get_shape_env"),
            (config.as_str(), "ConfigModule._get_dict"),
        ];
        assert!(made_by_import(compiling));
        let eval_frame = format!("{torch}/_dynamo/eval_frame.py");
        let output = format!("{torch}/_inductor/output_code.py");
        let out =
            "/tmp/torchinductor_root/4c/c4csjzfhnke23yxn7otuhobc3ewyqqlud43r4kyjqpoek37zutm3.py";
        let calling = [
            (out, "Runner.call"),
            (output.as_str(), "CompiledFxGraph.__call__"),
            (eval_frame.as_str(), "_fn"),
            (user, "<module>"),
        ];
        assert!(!made_by_import(calling));
    }

    fn frame(module: &str, function: &str, file: &str, line: u32) -> SymFrame {
        SymFrame {
            address: "0x0".into(),
            function: Some(function.into()),
            file: (!file.is_empty()).then(|| file.into()),
            line: (line > 0).then_some(line),
            module: Some(module.into()),
            offset: "0x0".into(),
        }
    }

    fn site_of(frames: Vec<SymFrame>) -> String {
        StackReport {
            pid: 1,
            kind: crate::model::Kind::Heap,
            inherited: false,
            bytes: 0,
            blocks: 0,
            oldest_age_s: 0.0,
            allocators: Vec::new(),
            truncated: false,
            verdict: None,
            released: false,
            pages: Vec::new(),
            group: None,
            frames,
        }
        .site()
    }

    #[test]
    fn a_python_stack_is_named_by_the_users_innermost_line_not_the_interpreter() {
        let torch = "/venv/lib/python3.12/site-packages/torch/nn/functional.py";
        let frames = vec![
            frame("/usr/lib/x86_64-linux-gnu/libc.so.6", "malloc", "", 0),
            frame(
                "/usr/bin/python3.12",
                "_PyObject_MakeTpCall",
                "Objects/call.c",
                240,
            ),
            frame(PYTHON_MODULE, "mse_loss", torch, 3383),
            frame(PYTHON_MODULE, "forward_loss", "/work/train.py", 22),
            frame(PYTHON_MODULE, "<module>", "/work/train.py", 40),
            frame("/usr/bin/python3.12", "Py_RunMain", "Modules/main.c", 700),
        ];
        assert_eq!(site_of(frames), "forward_loss (train.py:22)");
    }

    /// torch.compile runs the user's module through code it generated (its output code in
    /// `/tmp/torchinductor_USER/`, torch.fx's `forward` in `<eval_with_key>.N`): the site is
    /// the user's line that called it, as without torch.compile.
    #[test]
    fn code_torch_compile_generated_is_not_the_users() {
        let out =
            "/tmp/torchinductor_root/4c/c4csjzfhnke23yxn7otuhobc3ewyqqlud43r4kyjqpoek37zutm3.py";
        let dynamo = "/venv/lib/python3.12/site-packages/torch/_dynamo/eval_frame.py";
        let frames = vec![
            frame(
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "posix_memalign",
                "",
                0,
            ),
            frame(PYTHON_MODULE, "Runner.call", out, 91),
            frame(PYTHON_MODULE, "forward", "<eval_with_key>.3", 7),
            frame(PYTHON_MODULE, "_fn", dynamo, 929),
            frame(PYTHON_MODULE, "<module>", "/work/compile_train.py", 12),
        ];
        assert_eq!(site_of(frames), "<module> (compile_train.py:12)");
    }

    #[test]
    fn packages_installed_outside_site_packages_are_not_the_users_code() {
        let root = std::env::temp_dir().join(format!("site-test-{}", std::process::id()));
        let pkg = root.join("deps/torch/nn/modules");
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::create_dir_all(root.join("deps/torch-2.13.0.dist-info")).unwrap();
        std::fs::create_dir_all(root.join("app")).unwrap();
        let linear = pkg.join("linear.py").display().to_string();
        let train = root.join("app/train.py").display().to_string();
        let frames = vec![
            frame(PYTHON_MODULE, "forward", &linear, 134),
            frame(PYTHON_MODULE, "<module>", &train, 43),
        ];
        assert_eq!(site_of(frames), "<module> (train.py:43)");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_stack_only_in_libraries_python_is_named_by_its_innermost_python_frame() {
        let lib = "/usr/lib/python3.11/json/decoder.py";
        let frames = vec![
            frame(
                "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
                "PyList_New",
                "",
                0,
            ),
            frame(PYTHON_MODULE, "raw_decode", lib, 353),
            frame(PYTHON_MODULE, "decode", lib, 337),
        ];
        assert_eq!(site_of(frames), "raw_decode (decoder.py:353)");
    }

    #[test]
    fn a_native_stack_is_named_by_the_programs_own_code() {
        let frames = vec![
            frame("/usr/lib/x86_64-linux-gnu/libc.so.6", "malloc", "", 0),
            frame(
                "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
                "operator new(unsigned long)",
                "",
                0,
            ),
            frame(
                "/app/thumbs",
                "std::vector<char>::vector",
                "/usr/include/c++/14/bits/stl_vector.h",
                600,
            ),
            frame(
                "/app/thumbs",
                "Image::Image(unsigned long)",
                "/app/thumbnailer.cpp",
                16,
            ),
        ];
        assert_eq!(
            site_of(frames),
            "Image::Image(unsigned long) (thumbnailer.cpp:16)"
        );
        let libs = vec![frame(
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "malloc",
            "",
            0,
        )];
        assert_eq!(site_of(libs), "malloc");
        assert_eq!(site_of(Vec::new()), "unknown stack");
    }
}
