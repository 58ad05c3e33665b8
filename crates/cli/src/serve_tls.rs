//! `uraid serve --tls`: which NBD clients must use TLS, and the server's certificate
//! (X.509) or pre-shared keys (TLS-PSK).
//!
//! The default is `require` whenever clients could come from another host (a TCP
//! listener on an address other than loopback) or a certificate or key file is given;
//! `off` on loopback and Unix sockets otherwise. Refused before the array is opened:
//! nothing is written when the TLS setup is wrong.

use anyhow::{bail, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use uraid_nbd::TlsServer;

/// `--tls`: NBD over TLS (NBD_OPT_STARTTLS, X.509 or PSK).
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
    /// NBD over TLS: off, on (offered) or require. Default: require when --tls-cert or
    /// --tls-psk is given or the listener is TCP on an address other than loopback; else
    /// off.
    #[arg(long, value_enum, value_name = "MODE")]
    pub tls: Option<TlsMode>,
    /// The server's X.509 certificate chain (PEM, its own certificate first).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// TLS with pre-shared keys (as nbdkit's --tls-psk): a file of identity:hexkey lines
    /// (psktool's format); clients give an identity and prove its key. In place of
    /// --tls-cert.
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
    if a.tls_psk.is_some() && a.tls_cert.is_some() {
        bail!("--tls-psk and --tls-cert are two kinds of TLS: choose one");
    }
    let given = a.tls_cert.is_some() || a.tls_psk.is_some();
    let elsewhere = match addr {
        Listen::None => {
            if a.tls.is_some() || given {
                bail!(
                    "--tls, --tls-cert and --tls-psk are for the NBD listener, and --no-nbd \
                     has none"
                );
            }
            return Ok(None);
        }
        Listen::Unix => None,
        Listen::Tcp(sa) => Some(sa).filter(|sa| !sa.ip().is_loopback()),
    };
    let mode = a.tls.unwrap_or(if given || elsewhere.is_some() {
        TlsMode::Require
    } else {
        TlsMode::Off
    });
    let required = mode == TlsMode::Require;
    let tls = match (&a.tls_cert, &a.tls_key, &a.tls_psk, mode) {
        (_, _, _, TlsMode::Off) => return Ok(None),
        (Some(c), Some(k), _, _) => TlsServer::from_pem_files(c, k, required)?,
        (_, _, Some(psk), _) => TlsServer::from_psk_file(psk, required)?,
        _ if a.tls.is_none() => {
            let sa = elsewhere.expect("only a listener off loopback requires TLS by default");
            bail!(
                "--nbd {sa} is reachable from other hosts, so TLS is required: give \
                 --tls-cert FILE --tls-key FILE or --tls-psk FILE, or --tls off on a \
                 network you trust"
            )
        }
        _ => bail!("--tls {mode:?} needs --tls-cert FILE and --tls-key FILE, or --tls-psk FILE"),
    };
    Ok(Some(tls))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(s: &str) -> Listen {
        Listen::Tcp(s.parse().unwrap())
    }

    #[test]
    fn tls_is_required_by_default_off_loopback_and_psk_is_one_kind_of_it() {
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
        assert!(e.to_string().contains("or --tls-psk FILE"), "{e}");
        let dir = std::env::temp_dir().join(format!("uraid-serve-psk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = dir.join("keys.psk");
        std::fs::write(&keys, "alice:0123456789abcdef\n").unwrap();
        let psk = TlsArgs {
            tls_psk: Some(keys.clone()),
            ..TlsArgs::default()
        };
        // Required by default, on loopback too, as with a certificate.
        let t = setup(&psk, tcp("127.0.0.1:1")).unwrap().unwrap();
        assert!(t.required);
        let offered = TlsArgs {
            tls: Some(TlsMode::On),
            tls_psk: Some(keys.clone()),
            ..TlsArgs::default()
        };
        assert!(!setup(&offered, tcp("0.0.0.0:1")).unwrap().unwrap().required);
        let both = TlsArgs {
            tls_psk: Some(keys.clone()),
            tls_cert: Some("/c.pem".into()),
            tls_key: Some("/k.pem".into()),
            ..TlsArgs::default()
        };
        let e = setup(&both, tcp("127.0.0.1:1")).unwrap_err();
        assert!(e.to_string().contains("choose one"), "{e}");
        let e = setup(&psk, Listen::None).unwrap_err();
        assert!(e.to_string().contains("--no-nbd"), "{e}");
        std::fs::write(&keys, "alice:xyz\n").unwrap();
        let e = setup(&psk, tcp("127.0.0.1:1")).unwrap_err().to_string();
        assert!(
            e.contains(&keys.display().to_string()) && e.contains("line 1"),
            "{e}"
        );
        let missing = TlsArgs {
            tls_psk: Some(dir.join("none.psk")),
            ..TlsArgs::default()
        };
        let e = setup(&missing, tcp("127.0.0.1:1")).unwrap_err().to_string();
        assert!(e.contains("none.psk"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
