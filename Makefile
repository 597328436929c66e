# Flashgate: `make run` starts the local stack, `make test` runs every test.
.PHONY: run test build release deps check clean

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
	bash deploy/local/install-deps.sh --postgres
	$(CARGO) build --workspace --bins
	$(CARGO) run -q -p flashgate -- --config config/flashgate.toml check
	$(CARGO) nextest run --workspace --no-fail-fast

check:
	$(CARGO) clippy --workspace --all-targets

clean:
	$(CARGO) clean
	rm -rf data
