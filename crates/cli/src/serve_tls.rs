//! `uraid serve --tls`: which NBD clients must use TLS, and the server's certificate.
//!
//! The default is `require` whenever clients could come from another host (a TCP
//! listener on an address other than loopback) or a certificate is given; `off` on
//! loopback and Unix sockets otherwise. Refused before the array is opened: nothing is
//! written when the TLS setup is wrong.

use anyhow::{bail, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use uraid_nbd::TlsServer;

/// `--tls`: NBD over TLS (NBD_OPT_STARTTLS, X.509).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    /// Plain NBD only.
    Off,
    /// TLS offered; plain clients are served too.
    On,
    /// Clients must STARTTLS before anything else (nbds://).
    Require,
}

/// The TLS options of `serve`.
#[derive(clap::Args, Debug, Default)]
pub struct TlsArgs {
    /// NBD over TLS: off, on (offered) or require. Default: require when --tls-cert is
    /// given or the listener is TCP on an address other than loopback; else off.
    #[arg(long, value_enum, value_name = "MODE")]
    pub tls: Option<TlsMode>,
    /// The server's X.509 certificate chain (PEM, its own certificate first).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// TLS with a pre-shared key (nbdkit's --tls-psk): not supported, refused by name.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
}

/// Where the NBD listener is: none (`--no-nbd`), a Unix socket, or a TCP address.
#[derive(Clone, Copy, Debug)]
pub enum Listen {
    /// No NBD listener.
    None,
    /// A Unix socket: this host only.
    Unix,
    /// TCP on this address.
    Tcp(SocketAddr),
}

/// The TLS the NBD listener at `addr` serves with.
pub fn setup(a: &TlsArgs, addr: Listen) -> Result<Option<TlsServer>> {
    if let Some(psk) = &a.tls_psk {
        bail!(
            "--tls-psk {}: TLS with a pre-shared key is not supported (rustls, uraid's TLS, \
             has no TLS-PSK); use an X.509 certificate: --tls-cert FILE --tls-key FILE",
            psk.display()
        );
    }
    let elsewhere = match addr {
        Listen::None => {
            if a.tls.is_some() || a.tls_cert.is_some() {
                bail!("--tls and --tls-cert are for the NBD listener, and --no-nbd has none");
            }
            return Ok(None);
        }
        Listen::Unix => None,
        Listen::Tcp(sa) => Some(sa).filter(|sa| !sa.ip().is_loopback()),
    };
    let mode = a
        .tls
        .unwrap_or(if a.tls_cert.is_some() || elsewhere.is_some() {
            TlsMode::Require
        } else {
            TlsMode::Off
        });
    let (cert, key) = match (&a.tls_cert, &a.tls_key, mode) {
        (_, _, TlsMode::Off) => return Ok(None),
        (Some(c), Some(k), _) => (c, k),
        _ if a.tls.is_none() => {
            let sa = elsewhere.expect("only a listener off loopback requires TLS by default");
            bail!(
                "--nbd {sa} is reachable from other hosts, so TLS is required: give \
                 --tls-cert FILE --tls-key FILE, or --tls off on a network you trust"
            )
        }
        _ => bail!("--tls {mode:?} needs --tls-cert FILE and --tls-key FILE"),
    };
    let tls = TlsServer::from_pem_files(cert, key, mode == TlsMode::Require)?;
    Ok(Some(tls))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(s: &str) -> Listen {
        Listen::Tcp(s.parse().unwrap())
    }

    #[test]
    fn tls_is_required_by_default_off_loopback_and_psk_is_refused() {
        let none = TlsArgs::default();
        assert!(setup(&none, tcp("127.0.0.1:10809")).unwrap().is_none());
        assert!(setup(&none, Listen::Unix).unwrap().is_none());
        let e = setup(&none, tcp("0.0.0.0:10809")).unwrap_err();
        assert!(e.to_string().contains("TLS is required"), "{e}");
        assert!(e.to_string().contains("--tls off"), "{e}");
        let off = TlsArgs {
            tls: Some(TlsMode::Off),
            ..TlsArgs::default()
        };
        assert!(setup(&off, tcp("0.0.0.0:10809")).unwrap().is_none());
        let on = TlsArgs {
            tls: Some(TlsMode::On),
            ..TlsArgs::default()
        };
        let e = setup(&on, tcp("127.0.0.1:1")).unwrap_err();
        assert!(e.to_string().contains("needs --tls-cert"), "{e}");
        let psk = TlsArgs {
            tls_psk: Some("/k".into()),
            ..TlsArgs::default()
        };
        let e = setup(&psk, tcp("127.0.0.1:1")).unwrap_err();
        assert!(
            e.to_string().contains("pre-shared key is not supported"),
            "{e}"
        );
    }
}
