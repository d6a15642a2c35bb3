//! Test helpers: CAs and certificates minted with rcgen, for the tests of every crate and the
//! benchmark. (The simulator, a program, mints its own with `percolator_sim::pki`, which
//! returns errors instead of panicking; this crate stays below every crate whose tests use it.)

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;

/// A CA that can sign certificates.
pub struct MkCa {
    pub der: CertificateDer<'static>,
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A minted leaf certificate with its PKCS#8 key, DER and PEM.
pub struct MkLeaf {
    pub der: CertificateDer<'static>,
    pub key_der: Vec<u8>,
    pub pem: String,
    pub key_pem: String,
}

/// A CA with CN `cn` (key usages keyCertSign and digitalSignature).
pub fn mk_ca(cn: &str) -> MkCa {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let cert = params.self_signed(&key).unwrap();
    MkCa { der: cert.der().clone(), pem: cert.pem(), issuer: Issuer::new(params, key) }
}

/// A leaf with CN `cn`, one O per entry of `orgs`, one extended key usage.
pub fn mk_leaf(ca: &MkCa, cn: &str, orgs: &[&str], eku: ExtendedKeyUsagePurpose, expired: bool) -> MkLeaf {
    mk_cert(ca, |params| {
        params.distinguished_name = DistinguishedName::new();
        if !cn.is_empty() {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        // rcgen keeps one value per DnType: the second O goes in under its raw OID.
        assert!(orgs.len() <= 2, "at most two O values");
        for (i, org) in orgs.iter().enumerate() {
            let ty = if i == 0 { DnType::OrganizationName } else { DnType::CustomDnType(vec![2, 5, 4, 10]) };
            params.distinguished_name.push(ty, *org);
        }
        params.extended_key_usages = vec![eku];
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
    })
}

/// A leaf signed by `ca` (key usage digitalSignature) with parameters set by `edit`.
pub fn mk_cert(ca: &MkCa, edit: impl FnOnce(&mut CertificateParams)) -> MkLeaf {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    edit(&mut params);
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    MkLeaf {
        der: cert.der().clone(),
        key_der: key.serialize_der(),
        pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// A serving leaf signed by `ca` for `names` (IP addresses or DNS names), EKU serverAuth.
pub fn mk_serving(ca: &MkCa, names: &[&str]) -> MkLeaf {
    let sans = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("serving names {names:?}: {e}"))
        .subject_alt_names;
    mk_cert(ca, |params| {
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    })
}
