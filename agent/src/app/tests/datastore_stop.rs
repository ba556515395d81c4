use crate::app::datastore_stopped;
use crate::datastore::DatastoreError;

/// A datastore task that ended by itself is an error to exit on, with its own reason: the
/// agent once broke out of its loop and exited 0 with the reason lost (a build without the
/// `etcd` feature given `--datastore etcd`).
#[tokio::test]
async fn a_datastore_that_stops_by_itself_is_an_error_with_its_reason() {
    let failed = tokio::spawn(async { Err::<(), _>(DatastoreError::Etcd("this routewarden was built without the `etcd` feature".to_owned())) });
    assert_eq!(
        format!("{:#}", datastore_stopped(failed.await)),
        "the datastore stopped: datastore etcd: this routewarden was built without the `etcd` feature"
    );
    let ended = tokio::spawn(async { Ok::<(), DatastoreError>(()) });
    assert_eq!(format!("{:#}", datastore_stopped(ended.await)), "the datastore stopped without an error");
    let panicked = tokio::spawn(async { panic!("boom") });
    let panicked: Result<Result<(), DatastoreError>, _> = panicked.await;
    let text = format!("{:#}", datastore_stopped(panicked));
    assert!(text.starts_with("the datastore task failed: task ") && text.ends_with(" panicked with message \"boom\""), "{text}");
}
