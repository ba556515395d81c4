//! Unit tests of `links.rs`.

use super::*;

fn links() -> Links {
    let mut l = Links::default();
    l.replace(&[LinkInfo { index: 2, name: "eth0".into(), up: true }, LinkInfo { index: 3, name: "tunl0".into(), up: false }]);
    l
}

#[test]
fn resolve_by_name_needs_a_known_link_that_is_up() {
    let l = links();
    assert_eq!(l.resolve(None), Ok(None));
    assert_eq!(l.resolve(Some("eth0")), Ok(Some(2)));
    assert_eq!(l.resolve(Some("tunl0")), Err((ErrorKind::DeviceDown, "tunl0".into())));
    assert_eq!(l.resolve(Some("vxlan.calico")), Err((ErrorKind::NoDevice, "vxlan.calico".into())));
    assert!(l.is_up(2) && !l.is_up(3) && !l.is_up(9));
}

#[test]
fn the_memo_answers_what_resolve_answers_in_any_order() {
    let l = links();
    let names = [Some("eth0"), Some("eth0"), None, Some("tunl0"), Some("eth0"), Some("vxlan.calico"), Some("eth0"), Some("tunl0"), Some("tunl0"), None];
    let mut memo = l.memo();
    let got: Vec<_> = names.iter().map(|n| memo.resolve(*n)).collect();
    let want: Vec<_> = names.iter().map(|n| l.resolve(*n)).collect();
    assert_eq!(got, want);
    assert_eq!(got[1], Ok(Some(2)));
    assert_eq!(got[8], Err((ErrorKind::DeviceDown, "tunl0".into())), "an error is not kept as an answer");
    // More devices than the memo keeps, asked in turn twice: the same answers.
    let mut many = Links::default();
    let infos: Vec<LinkInfo> =
        (0..u32::try_from(MEMO_DEVICES).unwrap() + 4).map(|i| LinkInfo { index: 10 + i, name: format!("eth{i}"), up: i % 3 != 0 }).collect();
    many.replace(&infos);
    let names: Vec<&str> = infos.iter().chain(&infos).map(|l| l.name.as_str()).collect();
    let mut memo = many.memo();
    let got: Vec<_> = names.iter().map(|n| memo.resolve(Some(n))).collect();
    assert_eq!(got, names.iter().map(|n| many.resolve(Some(n))).collect::<Vec<_>>());
    assert_eq!(got[names.len() - 1], Ok(Some(10 + u32::try_from(MEMO_DEVICES).unwrap() + 3)));
}

#[test]
fn updates_say_what_may_have_been_flushed() {
    let mut l = links();
    assert!(l.update(2, "eth0", true).is_none(), "nothing changed");
    let c = l.update(3, "tunl0", true).unwrap();
    assert!(c.maybe_flushed && c.old_name.is_none());
    let c = l.update(2, "ens3", true).unwrap();
    assert!(!c.maybe_flushed, "a rename alone loses nothing");
    assert_eq!(c.old_name.as_deref(), Some("eth0"));
    assert_eq!(l.resolve(Some("ens3")), Ok(Some(2)));
    assert_eq!(l.resolve(Some("eth0")).unwrap_err().0, ErrorKind::NoDevice);
    assert!(l.update(7, "eth1", true).unwrap().maybe_flushed, "a new link");
}

#[test]
fn remove_keeps_a_name_another_link_took() {
    let mut l = links();
    l.update(4, "eth0", true);
    l.remove(2, "eth0");
    assert_eq!(l.resolve(Some("eth0")), Ok(Some(4)));
    l.forget_name("eth0");
    assert_eq!(l.resolve(Some("eth0")).unwrap_err().0, ErrorKind::NoDevice);
}

#[test]
fn a_refresh_is_taken_once() {
    let mut l = links();
    assert!(!l.take_refresh());
    l.request_refresh();
    assert!(l.take_refresh());
    assert!(!l.take_refresh());
}
