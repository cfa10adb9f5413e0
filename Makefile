# nanowire: two commands do everything on a fresh Debian 12 machine, as root.
#   make lab    build, bring up the virtual testbed, run the quick seed suite
#   make test   build and run every test (what CI runs)

CARGO ?= cargo
NANOWIRE := target/release/nanowire
REPORT ?= lab-report

.PHONY: lab test deps build lint lab-full clean fuzz soak

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release --workspace --locked

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets --locked -- -D warnings

# The report test renders index.html in headless Chromium: install it for tests.
test: export NANOWIRE_WITH_BROWSER := 1
test: deps lint
	$(CARGO) test --release --workspace --locked -- --test-threads=2

lab: build
	$(NANOWIRE) lab up
	scripts/lab-quick.sh $(NANOWIRE) $(REPORT)

lab-full: build
	$(NANOWIRE) lab up
	$(NANOWIRE) lab report --out $(REPORT)

# Fuzz every target for FUZZ_SECONDS each (libFuzzer on stable Rust); crashes
# are kept in fuzz/regressions/<target>/ and replayed by `make test`.
FUZZ_SECONDS ?= 60
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh

# One hour at a fixed rate through the impaired lab (docs/soak/), then 100
# SIGKILL cycles under traffic. SOAK_SECONDS, SOAK_RATE, SOAK_LOSS tune it.
soak: build
	scripts/soak.sh
	NANOWIRE_KILL_CYCLES=100 $(CARGO) test --release --locked -p nanowire --test faults sigkill -- --test-threads=1

clean:
	-$(NANOWIRE) lab down
	$(CARGO) clean
