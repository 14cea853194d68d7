# Developer shortcuts (https://github.com/casey/just); each line is plain cargo.

fmt:
    cargo fmt --all

check:
    cargo clippy --workspace --all-targets -- -D warnings

test:
    cargo test --workspace

schemas:
    UPDATE_SCHEMA=1 cargo test --test it schemas

ci:
    bash .ci/run

# Mutation check of one file against the library's unit tests (docs/mutants.md); not in
# CI: one run takes tens of minutes on 2 cores. `--in-place` reuses the warm target/
# (do not edit the tree while it runs).
mutants FILE:
    cargo mutants --in-place --file {{FILE}} -- --lib
