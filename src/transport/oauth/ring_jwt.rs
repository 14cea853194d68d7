//! jsonwebtoken's signatures checked by ring: the crate parses headers, claims and JWKs,
//! and asks a process-wide provider to check signatures; this one uses ring, the
//! cryptography rustls already uses here, so no second library is linked. It verifies
//! only (fieldgate never signs a token), and only public-key algorithms: an HMAC
//! algorithm is refused whatever the key.

use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::signature::{self, Verifier};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind, EncodingKey};
use ring::signature as sig;

/// Installs the provider once; one installed before (by an embedding program) is kept.
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = PROVIDER.install_default();
    });
}

static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: no_signer,
    verifier_factory: verifier,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: |_| Err(ErrorKind::InvalidKeyFormat.into()),
        rsa_pub_components_from_public_key: |_| Err(ErrorKind::InvalidKeyFormat.into()),
        ec_pub_components_from_private_key: |_, _| Err(ErrorKind::InvalidKeyFormat.into()),
        ed_pub_components_from_private_key: |_, _| Err(ErrorKind::InvalidKeyFormat.into()),
        compute_digest: |data, hash| {
            use jsonwebtoken::jwk::ThumbprintHash;
            let alg = match hash {
                ThumbprintHash::SHA256 => &ring::digest::SHA256,
                ThumbprintHash::SHA384 => &ring::digest::SHA384,
                ThumbprintHash::SHA512 => &ring::digest::SHA512,
                _ => return Err(ErrorKind::InvalidAlgorithm.into()),
            };
            Ok(ring::digest::digest(alg, data).as_ref().to_vec())
        },
    },
};

fn no_signer(_: &Algorithm, _: &EncodingKey) -> Result<Box<dyn JwtSigner>, Error> {
    Err(ErrorKind::InvalidAlgorithm.into())
}

fn verifier(alg: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>, Error> {
    if alg.family() == AlgorithmFamily::Hmac || key.family() != alg.family() {
        return Err(ErrorKind::InvalidAlgorithm.into());
    }
    Ok(Box::new(RingVerifier { alg: *alg, key: key.clone() }))
}

struct RingVerifier {
    alg: Algorithm,
    key: DecodingKey,
}

/// ring's algorithm for `alg`, given the key's form.
fn rsa_params(alg: Algorithm) -> Option<&'static sig::RsaParameters> {
    Some(match alg {
        Algorithm::RS256 => &sig::RSA_PKCS1_2048_8192_SHA256,
        Algorithm::RS384 => &sig::RSA_PKCS1_2048_8192_SHA384,
        Algorithm::RS512 => &sig::RSA_PKCS1_2048_8192_SHA512,
        Algorithm::PS256 => &sig::RSA_PSS_2048_8192_SHA256,
        Algorithm::PS384 => &sig::RSA_PSS_2048_8192_SHA384,
        Algorithm::PS512 => &sig::RSA_PSS_2048_8192_SHA512,
        _ => return None,
    })
}

impl Verifier<Vec<u8>> for RingVerifier {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> Result<(), signature::Error> {
        let checked = match (self.alg, self.key.kind()) {
            (alg, DecodingKeyKind::RsaModulusExponent { n, e }) => match rsa_params(alg) {
                Some(p) => sig::RsaPublicKeyComponents { n, e }.verify(p, msg, signature),
                None => Err(ring::error::Unspecified),
            },
            (alg, DecodingKeyKind::SecretOrDer(bytes)) => {
                let ring_alg: &'static dyn sig::VerificationAlgorithm = match alg {
                    Algorithm::ES256 => &sig::ECDSA_P256_SHA256_FIXED,
                    Algorithm::ES384 => &sig::ECDSA_P384_SHA384_FIXED,
                    Algorithm::EdDSA => &sig::ED25519,
                    other => match rsa_params(other) {
                        Some(p) => p,
                        None => return Err(signature::Error::new()),
                    },
                };
                sig::UnparsedPublicKey::new(ring_alg, bytes).verify(msg, signature)
            }
        };
        checked.map_err(|_| signature::Error::new())
    }
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }
}
