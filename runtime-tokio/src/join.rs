//! The flags with which every role joins the federation: where to dial, the join secret, the
//! transport and the identity key. `tela node`, `tela anchor` and `tela gateway` flatten
//! [`JoinArgs`] into their own flags (`#[command(flatten)]`), so each flag, its environment
//! variable and its parsing are written once.
//!
//! The help text here is the node's. A role whose words differ (its identity key's default
//! file, whom it dials) says so with `#[command(mut_arg("identity", |a| a.help("...")))]` on
//! its own flags, and a role that wants clap to fill in a default transport adds
//! `default_value("auto")` the same way; the node leaves it unset, so that its `--config` file
//! can give one.

use std::path::PathBuf;

use tela_transports::TransportMode;

/// How this member joins the federation (see the module docs).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct JoinArgs {
    /// The federation's join secret (prefer TELA_JOIN_SECRET or --join-secret-file: command
    /// lines are visible to other users).
    #[arg(long, env = "TELA_JOIN_SECRET", hide_env_values = true, value_name = "SECRET")]
    pub join_secret: Option<String>,

    /// Read the join secret from this file (first line).
    #[arg(long, env = "TELA_JOIN_SECRET_FILE", value_name = "PATH")]
    pub join_secret_file: Option<PathBuf>,

    /// A gateway or anchor to dial (host:port); repeat for several.
    #[arg(long, env = "TELA_JOIN", value_delimiter = ',', value_name = "HOST:PORT")]
    pub join: Vec<String>,

    /// Transport to the gateways: QUIC, TCP+TLS, or QUIC falling back to TCP [default: auto].
    #[arg(long, env = "TELA_TRANSPORT", value_name = "auto|quic|tcp")]
    pub transport: Option<TransportMode>,

    /// Identity key file, created on first run [default: ~/.config/tela/identity.key].
    #[arg(long, env = "TELA_IDENTITY", value_name = "PATH")]
    pub identity: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        join: JoinArgs,
    }

    #[test]
    fn a_transport_that_is_not_one_of_the_three_is_refused_with_the_choices() {
        let err = Cli::try_parse_from(["tela", "--transport", "udp"]).err().expect("refused").to_string();
        assert!(err.contains("auto, quic, tcp") || err.contains("auto|quic|tcp"), "{err}");
        let cli = Cli::try_parse_from(["tela", "--transport", "TCP", "--join", "a:1,b:2"]).expect("parses");
        assert_eq!(cli.join.transport, Some(TransportMode::Tcp));
        assert_eq!(cli.join.join, ["a:1", "b:2"]);
    }
}
