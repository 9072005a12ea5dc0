//! Gives this crate's own tests and examples an rpath to the libdevcoord that devcoord-sys
//! linked (its `DEP_DEVCOORD_LIB_DIR`), so they run without LD_LIBRARY_PATH.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_DEVCOORD_LIB_DIR");
    if let Ok(dirs) = std::env::var("DEP_DEVCOORD_LIB_DIR") {
        for dir in dirs.split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
        }
    }
}
