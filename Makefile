# nanowire: two commands do everything on a fresh Debian 12 machine, as root.
#   make lab    build, bring up the virtual testbed, run the quick seed suite
#   make test   build and run every test (what CI runs)

CARGO ?= cargo
NANOWIRE := target/release/nanowire
REPORT ?= lab-report

.PHONY: lab test deps build lint lab-full clean fuzz soak release install uninstall deb

# `make install` / `make uninstall` / `make deb` (no root needed for DESTDIR or deb).
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR := $(PREFIX)/bin
LIBDIR := $(PREFIX)/lib/nanowire
MANDIR := $(PREFIX)/share/man/man1
BASHDIR := $(PREFIX)/share/bash-completion/completions
ZSHDIR ?= $(PREFIX)/share/zsh/site-functions
FISHDIR := $(PREFIX)/share/fish/vendor_completions.d
# The shim as shipped: built with the `shim` profile (fat LTO, Cargo.toml).
SHIM := target/shim/libnanowire_preload.so
# What the installed tree holds, relative to $(DESTDIR); uninstall removes exactly these.
INSTALLED = $(BINDIR)/nanowire $(LIBDIR)/libnanowire_preload.so $(BASHDIR)/nanowire \
	$(ZSHDIR)/_nanowire $(FISHDIR)/nanowire.fish

deps:
	@scripts/install-deps.sh

# The shim last, and touched: `nanowire run` takes the newer of target/shim/'s
# and target/release/'s copies (nanowire_run::cli::preload_beside).
build: deps
	$(CARGO) build --release --workspace --locked
	$(CARGO) build --profile shim --locked -p nanowire-preload
	touch $(SHIM)

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets --locked -- -D warnings
	python3 scripts/import_cycles.py

# The report test renders index.html in headless Chromium: install it for tests.
# Tests that need root are #[ignore = "needs root"]: `make test` (as root)
# runs them too; a plain `cargo test` runs only the unprivileged ones. The
# shim's own unit tests (crates/preload, `test = false`: a workspace run
# skips it) are run by name.
test: export NANOWIRE_WITH_BROWSER := 1
test: deps lint
	$(CARGO) test --release --workspace --locked --no-fail-fast -- --test-threads=2 --include-ignored
	$(CARGO) test --release --locked -p nanowire-preload --lib

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

# The binary and the shim, nothing else (no deps check: install needs only cargo).
release:
	$(CARGO) build --release --locked -p nanowire
	$(CARGO) build --profile shim --locked -p nanowire-preload
	touch $(SHIM)

# The binary in $(BINDIR), the shim in $(LIBDIR) (where an installed
# `nanowire run` looks: ../lib/nanowire beside the binary), completions and man
# pages generated from the CLI definition itself.
install: release
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(MANDIR) \
		$(DESTDIR)$(BASHDIR) $(DESTDIR)$(ZSHDIR) $(DESTDIR)$(FISHDIR)
	install -m 0755 $(NANOWIRE) $(DESTDIR)$(BINDIR)/nanowire
	install -m 0644 $(SHIM) $(DESTDIR)$(LIBDIR)/libnanowire_preload.so
	$(NANOWIRE) completions bash > $(DESTDIR)$(BASHDIR)/nanowire
	$(NANOWIRE) completions zsh > $(DESTDIR)$(ZSHDIR)/_nanowire
	$(NANOWIRE) completions fish > $(DESTDIR)$(FISHDIR)/nanowire.fish
	rm -rf target/man && $(NANOWIRE) man target/man
	install -m 0644 target/man/*.1 $(DESTDIR)$(MANDIR)/

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED)) $(DESTDIR)$(MANDIR)/nanowire.1 $(DESTDIR)$(MANDIR)/nanowire-*.1
	-rmdir $(DESTDIR)$(LIBDIR)

# A Debian package from a staged install (dpkg-deb only, no extra tool):
# target/deb/nanowire_VERSION_ARCH.deb. Binaries stripped of debug info, man
# pages gzipped (Debian policy); dependencies from the ELF files' glibc symbol
# versions plus the tools nanowire runs (iproute2, ethtool).
DEB_ROOT := target/deb/root
deb: release
	rm -rf $(DEB_ROOT)
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/$(DEB_ROOT) PREFIX=/usr CARGO=true ZSHDIR=/usr/share/zsh/vendor-completions
	strip --strip-debug $(DEB_ROOT)/usr/bin/nanowire $(DEB_ROOT)/usr/lib/nanowire/libnanowire_preload.so
	gzip -9n $(DEB_ROOT)/usr/share/man/man1/*.1
	scripts/deb-control.sh $(DEB_ROOT) > /dev/null
	dpkg-deb --root-owner-group -Zxz -z6 --build $(DEB_ROOT) target/deb/
	@ls target/deb/*.deb

clean:
	-$(NANOWIRE) lab down
	$(CARGO) clean
