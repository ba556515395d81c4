//! The embedded BPF object's maps are exactly the ones `routewarden_common::MAP_NAMES` lists.
//! The kernel side names each map by its static's identifier and checks it
//! against the shared constant at compile time (`assert_bpf_name!`); this test closes the
//! other direction: a map declared in `ebpf/` with no shared constant, or a constant whose map
//! is gone, fails here. It parses the object only (aya-obj): no root, nothing loaded.

use std::collections::BTreeSet;

#[test]
fn the_object_has_exactly_the_maps_common_names() {
    let Some(obj) = routewarden::bpf::embedded_object() else {
        routewarden_lab::skip("the_object_has_exactly_the_maps_common_names", format_args!("built without the BPF object; `cargo xtask test` embeds it"));
        return;
    };
    let parsed = aya_obj::Object::parse(obj).expect("parse the embedded BPF object");
    // The compiler's data sections (`.rodata`, `.bss`, ...) and aya-log's ring are not ours.
    let in_object: BTreeSet<&str> = parsed.maps.keys().map(String::as_str).filter(|n| !n.starts_with('.') && *n != "AYA_LOGS").collect();
    let listed: BTreeSet<&str> = routewarden_common::MAP_NAMES.iter().copied().collect();
    assert_eq!(in_object, listed, "maps in the object vs routewarden_common::MAP_NAMES");
    assert!(parsed.maps.contains_key("AYA_LOGS"), "aya-log's ring is in the object: {:?}", parsed.maps.keys());
}
