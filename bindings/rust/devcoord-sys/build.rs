//! Finds libdevcoord: `$DEVCOORD_LIB_DIR` (a directory holding libdevcoord.so, e.g. the
//! build tree's `client/`) when set, else `pkg-config --libs devcoord`. Emits the link
//! directives and, for the dependents' tests and examples, the directory as `DEP_DEVCOORD_LIB_DIR`
//! (crate `devcoord` turns it into an rpath).

use std::env;
use std::process::Command;

fn pkg_config(args: &[&str]) -> Option<String> {
    let out = Command::new("pkg-config").args(args).arg("devcoord").output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=DEVCOORD_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let mut dirs: Vec<String> = Vec::new();
    if let Some(dir) = env::var_os("DEVCOORD_LIB_DIR") {
        dirs.push(dir.to_string_lossy().into_owned());
    } else if let Some(libs) = pkg_config(&["--libs"]) {
        for flag in libs.split_whitespace() {
            if let Some(dir) = flag.strip_prefix("-L") {
                dirs.push(dir.to_string());
            }
        }
        if dirs.is_empty() {
            if let Some(dir) = pkg_config(&["--variable=libdir"]) {
                dirs.push(dir);
            }
        }
    } else {
        println!(
            "cargo:warning=devcoord-sys: neither DEVCOORD_LIB_DIR nor `pkg-config devcoord` \
             found libdevcoord; relying on the linker's default paths"
        );
    }
    for dir in &dirs {
        println!("cargo:rustc-link-search=native={}", dir);
        // this crate's own tests; dependents add theirs from DEP_DEVCOORD_LIB_DIR
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
    println!("cargo:rustc-link-lib=dylib=devcoord");
    println!("cargo:lib_dir={}", dirs.join(":"));
}
