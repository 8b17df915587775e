//! What fleet does with each `ssh_config(5)` keyword: honour it, ignore it (it cannot change
//! where, how or as whom fleet connects), or refuse the configuration, because silently
//! dropping it would connect somewhere or somehow OpenSSH would not.

/// How fleet treats a keyword.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Honoured,
    Ignored,
    /// Refused unless its value is one of `unless` (the keyword's no-op values, lowercase).
    Refused {
        unless: &'static [&'static str],
        hint: &'static str,
    },
}

const SET_IN_FLEET: &str = "remove it for this host (e.g. a `Host` block of its own before the \
                            one that sets it), or set what fleet needs in the host's ssh_options \
                            in fleet.yaml";

/// Keywords fleet implements (also the ones `Host`, `Match` and `Include` are read as).
pub const HONOURED: &[&str] = &[
    "Host",
    "Match",
    "Include",
    "HostName",
    "Port",
    "User",
    "IdentityFile",
    "IdentitiesOnly",
    "UserKnownHostsFile",
    "ConnectTimeout",
    "ProxyJump",
    "ServerAliveInterval",
    "ServerAliveCountMax",
    "IgnoreUnknown",
];

/// Keywords that change where, how or as whom OpenSSH connects, which fleet does not do.
pub const REFUSED: &[(&str, &[&str], &str)] = &[
    (
        "ProxyCommand",
        &["none"],
        "fleet does not run proxy commands: use `ProxyJump host` (fleet opens the hops itself), \
         or `ProxyCommand none` for this host",
    ),
    (
        "HostKeyAlias",
        &[],
        "fleet checks host keys under the host's own name: remove it for this host",
    ),
    (
        "CertificateFile",
        &[],
        "fleet authenticates with plain keys only: remove it for this host",
    ),
    (
        "IdentityAgent",
        &["ssh_auth_sock"],
        "fleet uses the agent at $SSH_AUTH_SOCK: remove it for this host, and point \
         SSH_AUTH_SOCK at the agent instead",
    ),
    (
        "CanonicalizeHostname",
        &["no"],
        "fleet does not canonicalize host names: write the full name in HostName",
    ),
    ("AddressFamily", &["any"], SET_IN_FLEET),
    ("BindAddress", &[], SET_IN_FLEET),
    ("BindInterface", &[], SET_IN_FLEET),
    (
        "KnownHostsCommand",
        &["none"],
        "fleet reads host keys from UserKnownHostsFile only",
    ),
    (
        "RevokedHostKeys",
        &["none"],
        "fleet cannot check revoked host keys: remove the revoked key from known_hosts instead",
    ),
    (
        "PKCS11Provider",
        &["none"],
        "fleet cannot use hardware keys: load the key into ssh-agent or use an IdentityFile",
    ),
    (
        "SecurityKeyProvider",
        &["internal"],
        "fleet cannot use security-key providers: load the key into ssh-agent",
    ),
    (
        "RemoteCommand",
        &["none"],
        "fleet runs its own commands on the host: remove it for this host",
    ),
    (
        "ProxyUseFdpass",
        &["no"],
        "fleet does not run proxy commands",
    ),
    ("Tunnel", &["no"], SET_IN_FLEET),
    (
        "PubkeyAuthentication",
        &["yes", "unbound", "host-bound"],
        "fleet logs in with public keys only",
    ),
];

/// Keywords that cannot change where, how or as whom fleet connects.
pub const IGNORED: &[&str] = &[
    "AddKeysToAgent",
    "BatchMode",
    "CanonicalDomains",
    "CanonicalizeFallbackLocal",
    "CanonicalizeMaxDots",
    "CanonicalizePermittedCNAMEs",
    "CASignatureAlgorithms",
    "ChallengeResponseAuthentication",
    "ChannelTimeout",
    "CheckHostIP",
    "Cipher",
    "Ciphers",
    "ClearAllForwardings",
    "Compression",
    "CompressionLevel",
    "ConnectionAttempts",
    "ControlMaster",
    "ControlPath",
    "ControlPersist",
    "DynamicForward",
    "EnableEscapeCommandline",
    "EnableSSHKeysign",
    "EscapeChar",
    "ExitOnForwardFailure",
    "FingerprintHash",
    "ForkAfterAuthentication",
    "ForwardAgent",
    "ForwardX11",
    "ForwardX11Timeout",
    "ForwardX11Trusted",
    "GatewayPorts",
    "GlobalKnownHostsFile",
    "GSSAPIAuthentication",
    "GSSAPIClientIdentity",
    "GSSAPIDelegateCredentials",
    "GSSAPIKeyExchange",
    "GSSAPIKexAlgorithms",
    "GSSAPIRenewalForcesRekey",
    "GSSAPIServerIdentity",
    "GSSAPITrustDns",
    "HashKnownHosts",
    "HostbasedAcceptedAlgorithms",
    "HostbasedAuthentication",
    "HostbasedKeyTypes",
    "HostKeyAlgorithms",
    "IPQoS",
    "KbdInteractiveAuthentication",
    "KbdInteractiveDevices",
    "KexAlgorithms",
    "LocalCommand",
    "LocalForward",
    "LogLevel",
    "LogVerbose",
    "MACs",
    "NoHostAuthenticationForLocalhost",
    "NumberOfPasswordPrompts",
    "ObscureKeystrokeTiming",
    "PasswordAuthentication",
    "PermitLocalCommand",
    "PermitRemoteOpen",
    "PreferredAuthentications",
    "Protocol",
    "PubkeyAcceptedAlgorithms",
    "PubkeyAcceptedKeyTypes",
    "RekeyLimit",
    "RemoteForward",
    "RequestTTY",
    "RequiredRSASize",
    "SendEnv",
    "SessionType",
    "SetEnv",
    "StdinNull",
    "StreamLocalBindMask",
    "StreamLocalBindUnlink",
    "StrictHostKeyChecking",
    "SyslogFacility",
    "Tag",
    "TCPKeepAlive",
    "TunnelDevice",
    "UpdateHostKeys",
    "UseKeychain",
    "UsePrivilegedPort",
    "UseRoaming",
    "VerifyHostKeyDNS",
    "VisualHostKey",
    "WarnWeakCrypto",
    "XAuthLocation",
];

/// The policy for a keyword (any case); `None` for a keyword OpenSSH does not know either.
pub fn policy(keyword: &str) -> Option<Policy> {
    let is = |k: &&str| k.eq_ignore_ascii_case(keyword);
    if HONOURED.iter().any(is) {
        return Some(Policy::Honoured);
    }
    if let Some((_, unless, hint)) = REFUSED
        .iter()
        .find(|(k, _, _)| k.eq_ignore_ascii_case(keyword))
    {
        return Some(Policy::Refused { unless, hint });
    }
    IGNORED.iter().any(is).then_some(Policy::Ignored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_keyword_has_one_policy() {
        let mut all: Vec<String> = HONOURED
            .iter()
            .chain(IGNORED)
            .map(|k| k.to_ascii_lowercase())
            .chain(REFUSED.iter().map(|(k, _, _)| k.to_ascii_lowercase()))
            .collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a keyword is listed twice");
        for (_, unless, _) in REFUSED {
            assert!(unless.iter().all(|u| *u == u.to_ascii_lowercase()));
        }
    }

    #[test]
    fn lookups_ignore_case() {
        assert_eq!(policy("proxyjump"), Some(Policy::Honoured));
        assert_eq!(policy("CONTROLMASTER"), Some(Policy::Ignored));
        assert!(matches!(
            policy("ProxyCommand"),
            Some(Policy::Refused {
                unless: ["none"],
                ..
            })
        ));
        assert_eq!(policy("NoSuchOption"), None);
    }
}
