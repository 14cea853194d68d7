//! TLS for fieldgate's clients: one rustls crypto provider (ring) for the whole process.
//!
//! Every client that speaks TLS (the work-order webhook today, an MQTT client later)
//! calls [`install_crypto_provider`] before it builds its configuration, so the process
//! uses ring everywhere and never links a second provider. (OPC UA's secure channels
//! use async-opcua's own cryptography, not TLS.)

/// Installs ring as the process's rustls provider, once; a provider installed before
/// (by an embedding program) is kept.
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Err only when another thread installed one meanwhile: that one is used.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}
