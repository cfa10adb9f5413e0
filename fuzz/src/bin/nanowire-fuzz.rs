//! The libFuzzer driver: `NANOWIRE_FUZZ_TARGET=<name> nanowire-fuzz [libFuzzer args]`.
//! Built by `make fuzz` with sanitizer-coverage flags on stable Rust.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn run() -> fn(&[u8]) {
    static T: OnceLock<fn(&[u8])> = OnceLock::new();
    *T.get_or_init(|| {
        let name = std::env::var("NANOWIRE_FUZZ_TARGET").unwrap_or_default();
        match nanowire_fuzz::target(&name) {
            Some(t) => {
                // Seed an empty corpus directory with the target's seeds.
                if let Ok(dir) = std::env::var("NANOWIRE_FUZZ_SEED_DIR") {
                    let dir = std::path::Path::new(&dir);
                    for (i, s) in (t.seeds)().iter().enumerate() {
                        let _ = std::fs::write(dir.join(format!("seed-{i}")), s);
                    }
                }
                t.run
            }
            None => {
                let names: Vec<_> = nanowire_fuzz::TARGETS.iter().map(|t| t.name).collect();
                eprintln!(
                    "nanowire-fuzz: set NANOWIRE_FUZZ_TARGET to one of {}",
                    names.join(", ")
                );
                std::process::exit(2);
            }
        }
    })
}

fuzz_target!(|data: &[u8]| {
    run()(data);
});
