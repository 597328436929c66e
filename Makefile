# Flashgate: `make run` starts the local stack, `make test` runs every test.
.PHONY: run test build release deps check clean faults

# `make faults FAULT_RUNS=10`: the fault-injection suite only, N times.
FAULT_RUNS ?= 10

CARGO ?= cargo

deps:
	bash deploy/local/install-deps.sh

build: deps
	$(CARGO) build --workspace --bins

release: deps
	$(CARGO) build --release --workspace --bins

run: release
	bash deploy/local/run.sh

test: deps
	bash deploy/local/install-deps.sh --test
	$(CARGO) build --workspace --bins
	# The binary just built (a `cargo run -p` would rebuild with other features).
	target/debug/flashgate --config config/flashgate.toml check
	$(CARGO) nextest run --workspace --no-fail-fast

faults:
	$(CARGO) build --workspace --bins
	bash tests/run-faults.sh $(FAULT_RUNS)

check:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
	rm -rf data

# Side-by-side benchmark against the peers in ../shared/peers: writes bench/REPORT.md and bench/bench.png.
.PHONY: bench
bench: deps
	bash bench/run.sh
