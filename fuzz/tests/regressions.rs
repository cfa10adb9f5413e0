//! Replays every kept crash and seed (`fuzz/regressions/<target>/*`) and
//! runs a short deterministic mutation smoke of every target (CI).

use nanowire_fuzz::{Rng, TARGETS, mutate};
use std::path::Path;

#[test]
fn kept_inputs_replay_without_panicking() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    let mut n = 0;
    for t in TARGETS {
        let dir = root.join(t.name);
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_file() {
                let data = std::fs::read(&p).unwrap();
                eprintln!("replay {}", p.display());
                (t.run)(&data);
                n += 1;
            }
        }
    }
    eprintln!("{n} kept inputs replayed");
}

#[test]
fn every_target_survives_a_mutation_smoke() {
    for t in TARGETS {
        let seeds = (t.seeds)();
        assert!(!seeds.is_empty(), "{} has seeds", t.name);
        let mut rng = Rng::new(0x6e77 ^ t.name.len() as u64);
        for s in &seeds {
            (t.run)(s);
        }
        let mut pool = seeds.clone();
        for _ in 0..20_000 {
            let base = &pool[rng.below(pool.len())];
            let m = mutate(base, &mut rng);
            (t.run)(&m);
            if pool.len() < 64 {
                pool.push(m);
            } else {
                let i = rng.below(pool.len());
                pool[i] = m;
            }
        }
    }
}
