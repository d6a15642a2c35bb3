//! X.509 for client authentication: CA bundles that verify a presented chain (webpki through
//! rustls' `WebPkiClientVerifier`, clientAuth usage, validity at the time of the request), and
//! the little DER reading needed to take the user out of a verified leaf: the subject's CN
//! (user name), O values (groups) and the Kubernetes UID attribute (OID 1.3.6.1.4.1.57683.2),
//! as Go's `pkix.Name.FillFromRDNSequence` reads them.

use std::sync::{Arc, Mutex, OnceLock};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

/// Why a CA bundle could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CaBundleError {
    /// A PEM block does not parse.
    #[error("invalid PEM: {0}")]
    Pem(rustls::pki_types::pem::Error),
    /// A certificate is not usable as a trust anchor.
    #[error("unusable CA certificate: {0}")]
    UnusableCertificate(rustls::Error),
    /// The verifier could not be built from the anchors.
    #[error("building the verifier: {0}")]
    Verifier(rustls::server::VerifierBuilderError),
}

/// Why a presented chain was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CertificateError {
    /// The chain is empty.
    #[error("no certificate")]
    NoCertificate,
    /// The chain does not verify against the bundle (rustls' wording).
    #[error("{0}")]
    Rejected(rustls::Error),
    /// The verified leaf's subject cannot be read.
    #[error(transparent)]
    Der(#[from] DerError),
}

/// Why a certificate's DER could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DerError {
    /// Truncated, or a length that does not fit.
    #[error("malformed DER")]
    Malformed,
    /// A high tag number (never in a certificate's fields read here).
    #[error("unsupported DER tag")]
    UnsupportedTag,
    /// Another element where this one belongs.
    #[error("malformed DER: expected {0}")]
    Expected(&'static str),
    /// A time that is not text.
    #[error("malformed DER: time")]
    TimeNotText,
    /// A time that is neither `UTCTime` nor `GeneralizedTime`, or not a valid instant.
    #[error("malformed DER: time {0:?}")]
    Time(String),
    /// A `UTF8String` that is not UTF-8.
    #[error("invalid UTF8String")]
    Utf8String,
    /// A `NumericString`, `PrintableString` or `IA5String` that is not ASCII.
    #[error("invalid ASCII string")]
    AsciiString,
    /// A `BMPString` that is not UCS-2.
    #[error("invalid BMPString")]
    BmpString,
    /// A string type Go's `parseASN1String` does not accept.
    #[error("unsupported string type: {0}")]
    UnsupportedStringType(u8),
}

/// A CA bundle ready to verify client certificate chains.
#[derive(Clone)]
pub struct CaBundle {
    verifier: Arc<dyn ClientCertVerifier>,
    certs: usize,
    fingerprint: [u8; 32],
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle").field("certs", &self.certs).finish_non_exhaustive()
    }
}

impl PartialEq for CaBundle {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
    }
}

impl CaBundle {
    /// Builds a bundle from PEM text. `Ok(None)` when it holds no certificate (an empty
    /// ConfigMap key, for instance); an error when a block does not parse or no certificate is
    /// usable as a trust anchor.
    pub fn from_pem(pem: &[u8]) -> Result<Option<Self>, CaBundleError> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(pem).collect::<Result<_, _>>().map_err(CaBundleError::Pem)?;
        Self::from_der(certs)
    }

    /// Builds a bundle from DER certificates; `Ok(None)` when there are none.
    pub fn from_der(certs: Vec<CertificateDer<'static>>) -> Result<Option<Self>, CaBundleError> {
        if certs.is_empty() {
            return Ok(None);
        }
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        let mut roots = RootCertStore::empty();
        for cert in &certs {
            digest.update(cert.as_ref());
            roots.add(cert.clone()).map_err(CaBundleError::UnusableCertificate)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .allow_unauthenticated()
            .build()
            .map_err(CaBundleError::Verifier)?;
        let mut fingerprint = [0u8; 32];
        fingerprint.copy_from_slice(digest.finish().as_ref());
        Ok(Some(Self { verifier, certs: certs.len(), fingerprint }))
    }

    /// Number of CA certificates in the bundle.
    pub fn len(&self) -> usize {
        self.certs
    }

    /// Always false: an empty bundle is `None` (see [`CaBundle::from_pem`]).
    pub fn is_empty(&self) -> bool {
        self.certs == 0
    }

    /// Verifies `chain` (leaf first, then intermediates as the peer sent them) against this
    /// bundle for client authentication, now.
    pub fn verify(&self, chain: &[CertificateDer<'static>]) -> Result<(), CertificateError> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err(CertificateError::NoCertificate);
        };
        self.verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(CertificateError::Rejected)
    }
}

/// Verdicts kept per connection: the client CA and the front proxy CA, and a rotation of
/// either while the connection lives.
const MAX_VERDICTS: usize = 4;

/// A presented chain and the bundles it verified against (see
/// [`PeerCertificates::verify`](super::PeerCertificates::verify)).
pub(crate) struct PeerChain {
    chain: Vec<CertificateDer<'static>>,
    verdicts: Mutex<Vec<Verdict>>,
}

/// A success: the bundle's fingerprint, the last second (Unix) the chain is valid.
struct Verdict {
    bundle: [u8; 32],
    valid_until: u64,
    verified: Arc<VerifiedChain>,
}

/// What a verified chain gives the authenticators.
#[derive(Debug)]
pub struct VerifiedChain {
    /// The leaf's subject.
    pub subject: Subject,
    /// SHA-256 of the leaf (the x509 authenticator's credential id).
    pub leaf_sha256: [u8; 32],
    /// The x509 authenticator's answer for this chain, computed once.
    pub(crate) x509_user: OnceLock<Result<Option<Arc<super::UserInfo>>, ClientCertificateError>>,
}

impl PeerChain {
    pub(crate) fn new(chain: Vec<CertificateDer<'static>>) -> Self {
        Self { chain, verdicts: Mutex::new(Vec::new()) }
    }

    pub(crate) fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    pub(crate) fn verify(&self, ca: &CaBundle) -> Result<Arc<VerifiedChain>, CertificateError> {
        let now = UnixTime::now().as_secs();
        {
            let verdicts = self.verdicts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(v) = verdicts.iter().find(|v| v.bundle == ca.fingerprint && now <= v.valid_until) {
                return Ok(v.verified.clone());
            }
        }
        ca.verify(&self.chain)?;
        let leaf = self.chain.first().ok_or(CertificateError::NoCertificate)?;
        let mut leaf_sha256 = [0u8; 32];
        leaf_sha256.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, leaf.as_ref()).as_ref());
        let verified = Arc::new(VerifiedChain {
            subject: subject(leaf.as_ref())?,
            leaf_sha256,
            x509_user: OnceLock::new(),
        });
        // Valid until the first certificate of the chain expires (conservative: a certificate
        // the path did not use counts too). One that cannot be read is not remembered.
        let valid_until = self.chain.iter().map(|c| not_after(c.as_ref())).min_by(|a, b| match (a, b) {
            (Ok(a), Ok(b)) => a.cmp(b),
            (Err(_), _) => std::cmp::Ordering::Less,
            (_, Err(_)) => std::cmp::Ordering::Greater,
        });
        if let Some(Ok(valid_until)) = valid_until {
            let mut verdicts = self.verdicts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            verdicts.retain(|v| v.bundle != ca.fingerprint && now <= v.valid_until);
            if verdicts.len() >= MAX_VERDICTS {
                verdicts.remove(0);
            }
            verdicts.push(Verdict { bundle: ca.fingerprint, valid_until, verified: verified.clone() });
        }
        Ok(verified)
    }
}

/// The subject attributes that make a Kubernetes user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subject {
    /// The last CN (Go keeps the last one), empty when there is none.
    pub common_name: String,
    /// Every O value, in order.
    pub organizations: Vec<String>,
    /// Every value of the Kubernetes UID attribute (1.3.6.1.4.1.57683.2).
    pub uids: Vec<String>,
}

const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x55, 0x04, 0x0a];
/// 1.3.6.1.4.1.57683.2 (`apiserver/pkg/authentication/request/x509: uidOID`).
const OID_K8S_UID: &[u8] = &[0x2b, 0x06, 0x01, 0x04, 0x01, 0x83, 0xc2, 0x53, 0x02];

const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
const TAG_OID: u8 = 0x06;
const TAG_INTEGER: u8 = 0x02;
const TAG_VERSION: u8 = 0xa0;

/// The fields of a DER certificate's tbsCertificate from `validity` on: the optional version,
/// serialNumber, signature and issuer skipped.
fn after_issuer(cert: &[u8]) -> Result<&[u8], DerError> {
    let (certificate, _) = expect(cert, TAG_SEQUENCE, "certificate")?;
    let (tbs, _) = expect(certificate, TAG_SEQUENCE, "tbsCertificate")?;
    let mut rest = tbs;
    let (tag, _, after) = tlv(rest)?;
    if tag == TAG_VERSION {
        rest = after;
    }
    let (_, rest) = expect(rest, TAG_INTEGER, "serialNumber")?;
    let (_, rest) = expect(rest, TAG_SEQUENCE, "signature")?;
    let (_, rest) = expect(rest, TAG_SEQUENCE, "issuer")?;
    Ok(rest)
}

/// Reads the subject of a DER certificate.
pub(crate) fn subject(cert: &[u8]) -> Result<Subject, DerError> {
    let rest = after_issuer(cert)?;
    let (_, rest) = expect(rest, TAG_SEQUENCE, "validity")?;
    let (mut rdns, _) = expect(rest, TAG_SEQUENCE, "subject")?;

    let mut subject = Subject::default();
    while !rdns.is_empty() {
        let (mut rdn, next) = expect(rdns, TAG_SET, "RelativeDistinguishedName")?;
        rdns = next;
        while !rdn.is_empty() {
            let (atv, next) = expect(rdn, TAG_SEQUENCE, "AttributeTypeAndValue")?;
            rdn = next;
            let (oid, value) = expect(atv, TAG_OID, "attribute type")?;
            let (value_tag, value, _) = tlv(value)?;
            let value = asn1_string(value_tag, value)?;
            match oid {
                OID_CN => subject.common_name = value,
                OID_O => subject.organizations.push(value),
                OID_K8S_UID => subject.uids.push(value),
                _ => {}
            }
        }
    }
    Ok(subject)
}

/// The end of a certificate's validity (`notAfter`), in seconds since the Unix epoch.
pub fn not_after(cert: &[u8]) -> Result<u64, DerError> {
    let (validity, _) = expect(after_issuer(cert)?, TAG_SEQUENCE, "validity")?;
    let (_, _, validity) = tlv(validity)?;
    let (tag, time, _) = tlv(validity)?;
    asn1_time(tag, time)
}

/// `UTCTime` (`YYMMDDHHMMSSZ`, years 1950–2049 as RFC 5280 reads them) or `GeneralizedTime`
/// (`YYYYMMDDHHMMSSZ`), the two forms a certificate's validity takes, in Unix seconds.
fn asn1_time(tag: u8, value: &[u8]) -> Result<u64, DerError> {
    let text = std::str::from_utf8(value).map_err(|_| DerError::TimeNotText)?;
    let digits = text.strip_suffix('Z').filter(|d| d.bytes().all(|b| b.is_ascii_digit()));
    let field = |d: &str, at: usize, len: usize| d.get(at..at + len).and_then(|v| v.parse::<i16>().ok());
    let parsed = match (tag, digits) {
        (0x17, Some(d)) if d.len() == 12 => {
            field(d, 0, 2).map(|yy| (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &d[2..]))
        }
        (0x18, Some(d)) if d.len() == 14 => field(d, 0, 4).map(|yyyy| (yyyy, &d[4..])),
        _ => None,
    };
    let time = parsed.and_then(|(year, d)| {
        let [month, day, hour, minute, second] = [0, 2, 4, 6, 8].map(|at| field(d, at, 2));
        let date = jiff::civil::Date::new(year, i8::try_from(month?).ok()?, i8::try_from(day?).ok()?).ok()?;
        let time = jiff::civil::Time::new(
            i8::try_from(hour?).ok()?,
            i8::try_from(minute?).ok()?,
            i8::try_from(second?).ok()?,
            0,
        )
        .ok()?;
        let timestamp = date.to_datetime(time).to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
        u64::try_from(timestamp.as_second()).ok()
    });
    time.ok_or_else(|| DerError::Time(text.to_owned()))
}

/// Reads one TLV: (tag, content, rest). DER only: definite lengths, low tag numbers.
fn tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), DerError> {
    let (&tag, rest) = input.split_first().ok_or(DerError::Malformed)?;
    if tag & 0x1f == 0x1f {
        return Err(DerError::UnsupportedTag);
    }
    let (&first, mut rest) = rest.split_first().ok_or(DerError::Malformed)?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(DerError::Malformed);
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes.iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b))
    };
    if rest.len() < len {
        return Err(DerError::Malformed);
    }
    let (content, rest) = rest.split_at(len);
    Ok((tag, content, rest))
}

fn expect<'a>(input: &'a [u8], want: u8, what: &'static str) -> Result<(&'a [u8], &'a [u8]), DerError> {
    let (tag, content, rest) = tlv(input)?;
    if tag != want {
        return Err(DerError::Expected(what));
    }
    Ok((content, rest))
}

/// The string types Go's `parseASN1String` accepts.
fn asn1_string(tag: u8, value: &[u8]) -> Result<String, DerError> {
    match tag {
        // UTF8String
        0x0c => String::from_utf8(value.to_vec()).map_err(|_| DerError::Utf8String),
        // NumericString, PrintableString, IA5String
        0x12 | 0x13 | 0x16 => {
            if value.is_ascii() {
                Ok(value.iter().map(|b| char::from(*b)).collect())
            } else {
                Err(DerError::AsciiString)
            }
        }
        // T61String: Go keeps the bytes; read them as Latin-1.
        0x14 => Ok(value.iter().map(|b| char::from(*b)).collect()),
        // BMPString: UCS-2 big endian.
        0x1e => {
            if !value.len().is_multiple_of(2) {
                return Err(DerError::BmpString);
            }
            let units: Vec<u16> = value.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
            String::from_utf16(&units).map_err(|_| DerError::BmpString)
        }
        _ => Err(DerError::UnsupportedStringType(tag)),
    }
}

/// Why the x509 authenticator refused a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ClientCertificateError {
    /// The peer chain did not verify against the client CA.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    /// The Kubernetes UID attribute is present but empty.
    #[error("UID cannot be an empty string")]
    EmptyUid,
    /// The Kubernetes UID attribute is present more than once.
    #[error("expected 1 UID, but found multiple: {0:?}")]
    MultipleUids(Vec<String>),
}
