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
