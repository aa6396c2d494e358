//! The engine's layering (issue 49): no import circle spans more than one module folder, so
//! `mixers/` builds on the root's leaves and on `o1/`, `o1/` on nothing of the engine's, and the
//! root's core (model, state, sessions, the scheduler) on all of them. `tools/import_cycles.py`
//! reads every `crate::` / `super::` / `self::` path and prints the circles.

use std::process::Command;

#[test]
fn no_import_circle_spans_two_folders() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = Command::new("python3")
        .arg("tools/import_cycles.py")
        .arg("crates/engine/src")
        .current_dir(root)
        .output()
        .expect("python3 runs tools/import_cycles.py");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(text.contains(" 0 spanning more than one folder"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
}
