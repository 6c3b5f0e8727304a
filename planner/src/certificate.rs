//! What a server's certificate says, for the error that refuses it: its
//! subject, its issuer and the names it holds. TLS libraries say only why
//! a certificate was refused ("UnknownIssuer"); a user fixing `ca_cert` or
//! `sslrootcert` needs to know which CA signed it, and a host name
//! mismatch is fixed by knowing which names it holds. Reads just those
//! fields of the DER form (X.509 v3, RFC 5280); anything else is skipped.

/// One DER element: its tag, its content and what follows it.
fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The elements of a constructed element's content.
fn elements(mut content: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    std::iter::from_fn(move || {
        let (tag, value, rest) = element(content)?;
        content = rest;
        Some((tag, value))
    })
}

/// The short name of a naming attribute's OID (2.5.4.x), if common.
fn attribute_name(oid: &[u8]) -> Option<&'static str> {
    match oid {
        [0x55, 0x04, 0x03] => Some("CN"),
        [0x55, 0x04, 0x06] => Some("C"),
        [0x55, 0x04, 0x07] => Some("L"),
        [0x55, 0x04, 0x08] => Some("ST"),
        [0x55, 0x04, 0x0a] => Some("O"),
        [0x55, 0x04, 0x0b] => Some("OU"),
        _ => None,
    }
}

/// A string value of one of X.509's string types.
fn text(tag: u8, value: &[u8]) -> Option<String> {
    match tag {
        // UTF8String, PrintableString, IA5String, T61String
        0x0c | 0x13 | 0x16 | 0x14 => Some(printable(&String::from_utf8_lossy(value))),
        // BMPString: UTF-16BE
        0x1e => {
            let units: Vec<u16> = value
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            Some(printable(&String::from_utf16_lossy(&units)))
        }
        _ => None,
    }
}

/// A server's text as it may go into an error or a log line: control
/// characters and quotes escaped (a certificate is the server's to write).
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c if c.is_control() => c.escape_default().collect(),
            c => vec![c],
        })
        .collect()
}

/// A Name as `CN=host, O=org` (most specific first, as RFC 4514 writes
/// it), with the attributes it knows.
fn name(content: &[u8]) -> String {
    let mut parts: Vec<String> = Vec::new();
    for (_, rdn) in elements(content) {
        for (_, pair) in elements(rdn) {
            let mut fields = elements(pair);
            let (Some((0x06, oid)), Some((tag, value))) = (fields.next(), fields.next()) else {
                continue;
            };
            if let (Some(short), Some(value)) = (attribute_name(oid), text(tag, value)) {
                parts.push(format!("{short}={value}"));
            }
        }
    }
    parts.reverse();
    parts.join(", ")
}

/// The DNS names and IP addresses of a subjectAltName extension's value.
fn alt_names(value: &[u8]) -> Vec<String> {
    let Some((0x30, names, _)) = element(value) else {
        return vec![];
    };
    elements(names)
        .filter_map(|(tag, v)| match (tag, v.len()) {
            // dNSName [2]
            (0x82, _) => Some(printable(&String::from_utf8_lossy(v))),
            // iPAddress [7]
            (0x87, 4) => Some(std::net::Ipv4Addr::new(v[0], v[1], v[2], v[3]).to_string()),
            (0x87, 16) => <[u8; 16]>::try_from(v)
                .ok()
                .map(|b| std::net::Ipv6Addr::from(b).to_string()),
            _ => None,
        })
        .collect()
}

/// What a certificate says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    pub subject: String,
    pub issuer: String,
    /// Its subjectAltName DNS names and IP addresses.
    pub names: Vec<String>,
}

impl std::fmt::Display for Described {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "subject \"{}\", issued by \"{}\"",
            self.subject, self.issuer
        )?;
        if !self.names.is_empty() {
            write!(f, ", for {}", self.names.join(" "))?;
        }
        Ok(())
    }
}

/// Why our side refused a server's certificate, as TLS libraries word it
/// (rustls's `UnknownIssuer`, OpenSSL's "unknown issuer", ...): what the
/// errors that explain a refusal tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not signed by a trusted CA.
    UnknownIssuer,
    /// It does not name the host connected to.
    NotValidForName,
    /// Out of its validity period.
    Expired,
}

impl Refusal {
    /// The refusal an error's text reports, if it reports one.
    pub fn in_text(text: &str) -> Option<Refusal> {
        let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
        if has(&["UnknownIssuer", "unknown issuer"]) {
            Some(Refusal::UnknownIssuer)
        } else if has(&["NotValidForName", "not valid for name"]) {
            Some(Refusal::NotValidForName)
        } else if has(&["Expired", "expired"]) {
            Some(Refusal::Expired)
        } else {
            None
        }
    }
}

/// The subject, issuer and names of the DER certificate `der`; `None`
/// when it is not one.
pub fn describe(der: &[u8]) -> Option<Described> {
    let (0x30, cert, _) = element(der)? else {
        return None;
    };
    let (0x30, tbs, _) = element(cert)? else {
        return None;
    };
    let mut fields = elements(tbs).peekable();
    // version [0], when present
    if fields.peek().is_some_and(|(tag, _)| *tag == 0xa0) {
        fields.next();
    }
    let _serial = fields.next()?;
    let _signature = fields.next()?;
    let (0x30, issuer) = fields.next()? else {
        return None;
    };
    let _validity = fields.next()?;
    let (0x30, subject) = fields.next()? else {
        return None;
    };
    let mut names = Vec::new();
    // extensions [3], after the key and the optional unique ids
    for (tag, value) in fields {
        if tag != 0xa3 {
            continue;
        }
        let Some((0x30, extensions, _)) = element(value) else {
            continue;
        };
        for (_, extension) in elements(extensions) {
            let mut parts = elements(extension);
            let Some((0x06, [0x55, 0x1d, 0x11])) = parts.next() else {
                continue;
            };
            // critical BOOLEAN, when present, then the OCTET STRING
            if let Some((0x04, v)) = parts.find(|(t, _)| *t == 0x04) {
                names = alt_names(v);
            }
        }
    }
    Some(Described {
        subject: name(subject),
        issuer: name(issuer),
        names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    /// `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256
    /// -subj "/C=BR/O=urutau/CN=db.internal" -addext
    /// "subjectAltName=DNS:db.internal,DNS:db,IP:10.0.0.5"` (self-signed,
    /// made for this test).
    const CERT: &str = "\
MIIB3jCCAYWgAwIBAgIUf3EHoX9bPI0N4G9NomROZmVrEFQwCgYIKoZIzj0EAwIw
NDELMAkGA1UEBhMCQlIxDzANBgNVBAoMBnVydXRhdTEUMBIGA1UEAwwLZGIuaW50
ZXJuYWwwHhcNMjYxMjA0MDMzODAxWhcNMzYxMjAxMDMzODAxWjA0MQswCQYDVQQG
EwJCUjEPMA0GA1UECgwGdXJ1dGF1MRQwEgYDVQQDDAtkYi5pbnRlcm5hbDBZMBMG
ByqGSM49AgEGCCqGSM49AwEHA0IABM7DMusDTgdUBEjobTe0+5xwGuEOsWFgh5Ms
ZIAr5gAQ8rfNpdtKtn8ITjhUugHAjguwpuTPe9j84MKkgdkir+yjdTBzMB0GA1Ud
DgQWBBQB1E46u5RWTr9mWKhC1PORbUXw2TAfBgNVHSMEGDAWgBQB1E46u5RWTr9m
WKhC1PORbUXw2TAPBgNVHRMBAf8EBTADAQH/MCAGA1UdEQQZMBeCC2RiLmludGVy
bmFsggJkYocECgAABTAKBggqhkjOPQQDAgNHADBEAiAgvIfhyYeo/j54N08fLruA
Pd4NQWypocZBL3/iAPaEZQIgYveHik5fhhDRulXG00vYepk5o6ZXvjgcdT9ierQ6
7MM=";

    fn der() -> Vec<u8> {
        base64::engine::general_purpose::STANDARD
            .decode(CERT.replace('\n', ""))
            .unwrap()
    }

    #[test]
    fn subject_issuer_and_names_are_read() {
        let d = describe(&der()).unwrap();
        assert_eq!(d.subject, "CN=db.internal, O=urutau, C=BR");
        assert_eq!(d.issuer, "CN=db.internal, O=urutau, C=BR");
        assert_eq!(d.names, ["db.internal", "db", "10.0.0.5"]);
        assert_eq!(
            d.to_string(),
            "subject \"CN=db.internal, O=urutau, C=BR\", issued by \"CN=db.internal, O=urutau, C=BR\", for db.internal db 10.0.0.5"
        );
    }

    #[test]
    fn refusals_are_told_apart_in_either_wording() {
        for (text, want) in [
            (
                "invalid peer certificate: UnknownIssuer",
                Some(Refusal::UnknownIssuer),
            ),
            (
                "certificate verify failed: unknown issuer",
                Some(Refusal::UnknownIssuer),
            ),
            (
                "certificate not valid for name \"x\"",
                Some(Refusal::NotValidForName),
            ),
            ("invalid peer certificate: Expired", Some(Refusal::Expired)),
            ("connection refused", None),
        ] {
            assert_eq!(Refusal::in_text(text), want, "{text}");
        }
    }

    #[test]
    fn a_servers_text_is_escaped() {
        assert_eq!(printable("a\"b\\c\n\x1b[31m"), "a\\\"b\\\\c\\n\\u{1b}[31m");
        assert_eq!(printable("héllo"), "héllo");
    }

    #[test]
    fn what_is_not_a_certificate_is_not_described() {
        let der = der();
        assert_eq!(describe(&der[..der.len() / 2]), None);
        assert_eq!(describe(b"not a certificate"), None);
        assert_eq!(describe(&[]), None);
    }
}
