use super::*;

#[test]
fn datastore_spec_parses_file_and_rejects_others() {
    assert_eq!("file:examples".parse::<DatastoreSpec>(), Ok(DatastoreSpec::File("examples".into())));
    assert_eq!("file:/a/b.yaml".parse::<DatastoreSpec>(), Ok(DatastoreSpec::File("/a/b.yaml".into())));
    assert!("file:".parse::<DatastoreSpec>().is_err());
    assert_eq!(
        "etcd:x".parse::<DatastoreSpec>(),
        Err("unknown datastore \"etcd:x\": expected file:<path to a YAML file or directory>, kubernetes, or etcd".to_string())
    );
    assert_eq!("kubernetes".parse::<DatastoreSpec>(), Ok(DatastoreSpec::Kubernetes(KubernetesOptions::default())));
    assert!("kubernetes:x".parse::<DatastoreSpec>().is_err());
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    cluster: ClusterArgs,
}

#[test]
fn kubernetes_flags_fill_the_datastore_spec() {
    use crate::datastore::CalicoGroup;
    use clap::Parser;
    let c = Cli::try_parse_from([
        "x",
        "--datastore",
        "kubernetes",
        "--kubeconfig",
        "/k",
        "--calico-api-group",
        "projectcalico.org/v3",
        "--kube-watch-silence",
        "120",
        "--discovery-interval",
        "60",
    ])
    .unwrap();
    assert_eq!(
        c.cluster.datastore_spec(),
        Some(DatastoreSpec::Kubernetes(KubernetesOptions {
            kubeconfig: Some("/k".into()),
            api_group: ApiGroupChoice::Forced(CalicoGroup::V3),
            watch_silence: Some(Duration::from_mins(2)),
            discovery_interval: Some(Duration::from_mins(1)),
        }))
    );
    // 0 turns the silence check off; the default is 90 s.
    let c = Cli::try_parse_from(["x", "--datastore", "kubernetes", "--kube-watch-silence", "0"]).unwrap();
    assert_eq!(c.cluster.datastore_spec(), Some(DatastoreSpec::Kubernetes(KubernetesOptions { watch_silence: None, ..KubernetesOptions::default() })));
    assert_eq!(KubernetesOptions::default().watch_silence, Some(Duration::from_secs(90)));
    // 0: discovery runs again only when a watch answers 404; the default is every 300 s.
    let c = Cli::try_parse_from(["x", "--datastore", "kubernetes", "--discovery-interval", "0"]).unwrap();
    assert_eq!(c.cluster.datastore_spec(), Some(DatastoreSpec::Kubernetes(KubernetesOptions { discovery_interval: None, ..KubernetesOptions::default() })));
    assert_eq!(KubernetesOptions::default().discovery_interval, Some(Duration::from_mins(5)));
    let err = Cli::try_parse_from(["x", "--datastore", "kubernetes", "--discovery-interval", "5m"]).err().unwrap().to_string();
    assert!(err.contains("invalid value '5m' for '--discovery-interval <SECONDS>'"), "{err}");
    let c = Cli::try_parse_from(["x", "--datastore", "kubernetes"]).unwrap();
    assert_eq!(c.cluster.datastore_spec(), Some(DatastoreSpec::Kubernetes(KubernetesOptions::default())));
    let c = Cli::try_parse_from(["x", "--datastore", "kubernetes", "--calico-api-group", "crd.projectcalico.org/v1"]).unwrap();
    assert_eq!(c.cluster.calico_api_group, ApiGroupChoice::Forced(CalicoGroup::CrdV1));
    let err = Cli::try_parse_from(["x", "--datastore", "kubernetes", "--calico-api-group", "v3"]).err().unwrap().to_string();
    assert!(err.contains("unknown Calico API group \"v3\""), "{err}");
    // The Kubernetes flags do not change a file datastore.
    let c = Cli::try_parse_from(["x", "--datastore", "file:/a", "--calico-api-group", "projectcalico.org/v3"]).unwrap();
    assert_eq!(c.cluster.datastore_spec(), Some(DatastoreSpec::File("/a".into())));
}

#[test]
fn etcd_flags_fill_the_datastore_spec_with_calicoctl_fallbacks() {
    use clap::Parser;
    assert_eq!("etcd".parse::<DatastoreSpec>(), Ok(DatastoreSpec::Etcd(EtcdOptions::default())));
    let c = Cli::try_parse_from(["x", "--datastore", "etcd", "--etcd-endpoints", "https://10.0.0.1:2379,https://10.0.0.2:2379", "--etcd-ca-file", "/ca.pem"])
        .unwrap();
    let calicoctl = |name: &str| match name {
        "ETCD_ENDPOINTS" => Some("http://ignored:2379".to_owned()),
        "ETCD_CA_CERT_FILE" => Some("/ignored.pem".to_owned()),
        "ETCD_CERT_FILE" => Some("/cert.pem".to_owned()),
        "ETCD_KEY_FILE" => Some("/key.pem".to_owned()),
        _ => None,
    };
    // The flags win; calicoctl's variables fill what they leave unset.
    assert_eq!(
        c.cluster.etcd_options(calicoctl),
        EtcdOptions {
            endpoints: vec!["https://10.0.0.1:2379".into(), "https://10.0.0.2:2379".into()],
            ca_file: Some("/ca.pem".into()),
            cert_file: Some("/cert.pem".into()),
            key_file: Some("/key.pem".into()),
        }
    );
    let c = Cli::try_parse_from(["x", "--datastore", "etcd"]).unwrap();
    assert_eq!(
        c.cluster.etcd_options(|name| (name == "ETCD_ENDPOINTS").then(|| " http://a:2379, http://b:2379 ".to_owned())),
        EtcdOptions { endpoints: vec!["http://a:2379".into(), "http://b:2379".into()], ..EtcdOptions::default() }
    );
}

#[derive(clap::Parser)]
struct RunCli {
    #[command(flatten)]
    run: RunArgs,
}

#[test]
fn http_flags_default_to_the_http_limits_defaults() {
    use clap::Parser;
    let c = RunCli::try_parse_from(["x", "--datastore", "file:/a"]).unwrap();
    assert_eq!(c.run.http_limits(), HttpLimits::default());
    let c = RunCli::try_parse_from([
        "x",
        "--datastore",
        "file:/a",
        "--http-header-timeout",
        "2",
        "--http-idle-timeout",
        "60",
        "--http-max-connections",
        "16",
        "--http-request-timeout",
        "3",
    ])
    .unwrap();
    assert_eq!(
        c.run.http_limits(),
        HttpLimits {
            header_read_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_mins(1),
            max_connections: 16,
            request_timeout: Duration::from_secs(3),
        }
    );
    assert!(RunCli::try_parse_from(["x", "--datastore", "file:/a", "--http-max-connections", "0"]).is_err());
    assert!(RunCli::try_parse_from(["x", "--datastore", "file:/a", "--http-header-timeout", "0"]).is_err());
}
