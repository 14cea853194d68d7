//! fieldgate-sim: serves the demo plant's devices over real protocols, with fault injection.
