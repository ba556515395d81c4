//! What the datastore reads of an object: [`Trimmed`], decoded straight from the API server's
//! JSON with only what the model reads; every other field is skipped as it is decoded
//! ([`IgnoredAny`]: never allocated). A Node's `status.conditions`, `status.images` and
//! `metadata.managedFields` therefore cost a scan of their bytes, not a tree of values.
//!
//! What is kept, per [`Shape`] (the fields the model parser, [`ClusterBuilder::add`], reads;
//! everything else never reaches it):
//!
//! - every kind: `metadata.name`, `metadata.namespace`, `metadata.resourceVersion`;
//! - Calico kinds ([`CalicoSpec`]): `spec`, whole (decoded by [`PresizedValue`]: every sequence
//!   and mapping allocated once at its length);
//! - core Nodes ([`NodeAddresses`]): `metadata.annotations` whose key starts with
//!   `projectcalico.org/` (what calico-node writes, `libcalico-go/lib/backend/k8s/resources/node.go`)
//!   and `status.addresses`;
//! - the calico-node DaemonSet ([`CalicoNodeContainers`]): each of
//!   `spec.template.spec.containers`' `name`, `env` and `envFrom` (what Felix's settings can
//!   come from);
//! - the operator's Installation ([`RoutingMode`]): `spec.calicoNetwork.clusterRoutingMode`.
//!
//! `apiVersion` and `kind` are not read: list items of core types come without them, and
//! [`TrimmedObject::into_value`] takes both from the watched resource.
//!
//! A field found where a mapping (or list) was expected but holding something else is read
//! as absent, as a JSON pointer finds nothing through it: a foreign object never fails the
//! decode of a whole list. Metadata keeps the types `ObjectMeta` has (strings; a non-string
//! Calico annotation fails the decode, as it did with `DynamicObject`).
//!
//! [`ClusterBuilder::add`]: crate::model::ClusterBuilder::add

use std::borrow::Cow;
use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

use kube::api::{ApiResource, ObjectMeta};
use kube::core::DynamicResourceScope;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use super::presized_value::PresizedValue;

/// Annotation prefix the model reads on core Nodes (`libcalico-go/lib/backend/k8s/resources/node.go`).
pub(crate) const NODE_ANNOTATION_PREFIX: &str = "projectcalico.org/";

/// The fields of a calico-node container that are kept.
const CONTAINER_KEYS: &[&str] = &["name", "env", "envFrom"];

/// One object as the model reads it: the kept metadata (name, namespace, resourceVersion, a
/// Node's Calico annotations; every other field `None`) and the kept top-level fields
/// (`spec`, `status`), already trimmed. Held only until it is hashed and, when it changed,
/// parsed.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TrimmedObject {
    pub(crate) metadata: ObjectMeta,
    /// `spec` and/or `status` as the model reads them (see the module docs).
    pub(crate) body: Mapping,
}

impl TrimmedObject {
    /// `metadata.name` (empty when absent).
    pub(crate) fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// A hash of everything kept except `metadata.resourceVersion`: equal for two versions
    /// that differ only in what the model does not read (a Node heartbeat). Independent of
    /// the order of mapping keys.
    pub(crate) fn content_hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.metadata.name.hash(&mut h);
        self.metadata.namespace.hash(&mut h);
        self.metadata.annotations.hash(&mut h);
        self.body.hash(&mut h);
        h.finish()
    }

    /// The model parser's input: `apiVersion` and `kind` of `api`, the kept metadata, then
    /// the kept fields: `{apiVersion, kind, metadata: {annotations?, name, namespace?,
    /// resourceVersion}, spec?, status?}`.
    pub(crate) fn into_value(self, api: &ApiResource) -> Value {
        let TrimmedObject { metadata, body } = self;
        let mut meta = Mapping::new();
        if let Some(a) = metadata.annotations {
            meta.insert("annotations".into(), Value::Mapping(a.into_iter().map(|(k, v)| (Value::String(k), Value::String(v))).collect()));
        }
        for (key, v) in [("name", metadata.name), ("namespace", metadata.namespace), ("resourceVersion", metadata.resource_version)] {
            if let Some(v) = v {
                meta.insert(key.into(), Value::String(v));
            }
        }
        let mut m = Mapping::with_capacity(3 + body.len());
        m.insert("apiVersion".into(), Value::String(api.api_version.clone()));
        m.insert("kind".into(), Value::String(api.kind.clone()));
        m.insert("metadata".into(), Value::Mapping(meta));
        m.extend(body);
        Value::Mapping(m)
    }
}

/// What is kept of one kind's objects; the type parameter of [`Trimmed`].
pub(crate) trait Shape: 'static {
    /// Keep the `projectcalico.org/*` annotations.
    const CALICO_ANNOTATIONS: bool;

    /// Decode the value of top-level field `field` (`spec` or `status`) into `body`, or skip it.
    ///
    /// Errors: the decoder's (malformed JSON).
    fn field<'de, A: MapAccess<'de>>(field: Top, map: &mut A, body: &mut Mapping) -> Result<(), A::Error>;

    /// Complete `body` once every field was read.
    fn finish(_body: &mut Mapping) {}
}

/// Calico kinds: `spec`, whole.
#[derive(Debug)]
pub(crate) enum CalicoSpec {}

/// Core Nodes: `projectcalico.org/*` annotations and `status.addresses`.
#[derive(Debug)]
pub(crate) enum NodeAddresses {}

/// The calico-node DaemonSet: its containers' `name`, `env` and `envFrom`. The body is
/// always `{spec: {template: {spec: {containers: [...]}}}}`, the list empty when there is none.
#[derive(Debug)]
pub(crate) enum CalicoNodeContainers {}

/// The operator's Installation: `spec.calicoNetwork.clusterRoutingMode`. The body always has
/// a `spec` (`{}` without a mode).
#[derive(Debug)]
pub(crate) enum RoutingMode {}

impl Shape for CalicoSpec {
    const CALICO_ANNOTATIONS: bool = false;
    fn field<'de, A: MapAccess<'de>>(field: Top, map: &mut A, body: &mut Mapping) -> Result<(), A::Error> {
        match field {
            Top::Spec => drop(body.insert("spec".into(), map.next_value_seed(PresizedValue)?)),
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
}

impl Shape for NodeAddresses {
    const CALICO_ANNOTATIONS: bool = true;
    fn field<'de, A: MapAccess<'de>>(field: Top, map: &mut A, body: &mut Mapping) -> Result<(), A::Error> {
        match field {
            Top::Status => {
                if let Some(addresses) = map.next_value_seed(MapOr(Key("addresses", PhantomData::<Value>)))? {
                    body.insert("status".into(), one("addresses", addresses));
                } else {
                    body.remove("status");
                }
            }
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
}

impl Shape for CalicoNodeContainers {
    const CALICO_ANNOTATIONS: bool = false;
    fn field<'de, A: MapAccess<'de>>(field: Top, map: &mut A, body: &mut Mapping) -> Result<(), A::Error> {
        match field {
            Top::Spec => {
                let seed = MapOr(Key("template", MapOr(Key("spec", MapOr(Key("containers", SeqOr(MapOr(Keep(CONTAINER_KEYS)))))))));
                let containers = map.next_value_seed(seed)?.flatten().flatten().unwrap_or_default();
                body.insert("spec".into(), containers_spec(containers));
            }
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
    fn finish(body: &mut Mapping) {
        if !body.contains_key("spec") {
            body.insert("spec".into(), containers_spec(Vec::new()));
        }
    }
}

impl Shape for RoutingMode {
    const CALICO_ANNOTATIONS: bool = false;
    fn field<'de, A: MapAccess<'de>>(field: Top, map: &mut A, body: &mut Mapping) -> Result<(), A::Error> {
        match field {
            Top::Spec => {
                let mode = map.next_value_seed(MapOr(Key("calicoNetwork", MapOr(Key("clusterRoutingMode", PhantomData::<Value>)))))?.flatten();
                let spec = match mode {
                    Some(mode) => one("calicoNetwork", one("clusterRoutingMode", mode)),
                    None => Value::Mapping(Mapping::new()),
                };
                body.insert("spec".into(), spec);
            }
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
    fn finish(body: &mut Mapping) {
        if !body.contains_key("spec") {
            body.insert("spec".into(), Value::Mapping(Mapping::new()));
        }
    }
}

/// `{key: value}`.
fn one(key: &str, value: Value) -> Value {
    let mut m = Mapping::with_capacity(1);
    m.insert(key.into(), value);
    Value::Mapping(m)
}

/// `{template: {spec: {containers: [...]}}}`.
fn containers_spec(containers: Vec<Value>) -> Value {
    one("template", one("spec", one("containers", Value::Sequence(containers))))
}

/// An object of the resource, decoded with only what shape `S` keeps (see the module docs).
/// A [`kube::Resource`] with `DynamicType = ApiResource`, like `DynamicObject`, so
/// `Api::<Trimmed<S>>::all_with(client, &api_resource)` and the watcher take it.
pub(crate) struct Trimmed<S> {
    pub(crate) object: TrimmedObject,
    shape: PhantomData<fn() -> S>,
}

impl<S> Trimmed<S> {
    /// The shape-free object.
    pub(crate) fn into_object(self) -> TrimmedObject {
        self.object
    }
}

impl<S> Clone for Trimmed<S> {
    fn clone(&self) -> Self {
        Trimmed { object: self.object.clone(), shape: PhantomData }
    }
}

impl<S> fmt::Debug for Trimmed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.object.fmt(f)
    }
}

impl<S> kube::Resource for Trimmed<S> {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.object.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.object.metadata
    }
}

impl<'de, S: Shape> Deserialize<'de> for Trimmed<S> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<S>(PhantomData<fn() -> S>);
        impl<'de, S: Shape> Visitor<'de> for V<S> {
            type Value = Trimmed<S>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Kubernetes object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Trimmed<S>, A::Error> {
                let mut object = TrimmedObject::default();
                while let Some(field) = map.next_key::<Top>()? {
                    match field {
                        Top::Metadata => object.metadata = map.next_value_seed(Meta::<S>(PhantomData))?,
                        Top::Spec | Top::Status => S::field(field, &mut map, &mut object.body)?,
                        Top::Other => drop(map.next_value::<IgnoredAny>()?),
                    }
                }
                S::finish(&mut object.body);
                Ok(Trimmed { object, shape: PhantomData })
            }
        }
        d.deserialize_map(V::<S>(PhantomData))
    }
}

/// A top-level field of an object, as far as [`Shape`]s care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Top {
    Metadata,
    Spec,
    Status,
    /// Anything else (`apiVersion`, `kind`, ...): skipped.
    Other,
}

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match d.deserialize_identifier(KeyIndex(&["metadata", "spec", "status"]))? {
            Some(0) => Top::Metadata,
            Some(1) => Top::Spec,
            Some(2) => Top::Status,
            _ => Top::Other,
        })
    }
}

/// Reads a mapping key: its index in the list, `None` for any other key (nothing allocated).
#[derive(Clone, Copy)]
struct KeyIndex<'k>(&'k [&'static str]);

impl Visitor<'_> for KeyIndex<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|k| *k == v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|k| k.as_bytes() == v))
    }
}

impl<'de> DeserializeSeed<'de> for KeyIndex<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

/// `metadata`: name, namespace, resourceVersion, and the Calico annotations when `S` keeps them.
struct Meta<S>(PhantomData<fn() -> S>);

impl<'de, S: Shape> DeserializeSeed<'de> for Meta<S> {
    type Value = ObjectMeta;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ObjectMeta, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, S: Shape> Visitor<'de> for Meta<S> {
    type Value = ObjectMeta;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("object metadata")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ObjectMeta, A::Error> {
        let mut m = ObjectMeta::default();
        while let Some(key) = map.next_key_seed(KeyIndex(&["name", "namespace", "resourceVersion", "annotations"]))? {
            match key {
                Some(0) => m.name = map.next_value()?,
                Some(1) => m.namespace = map.next_value()?,
                Some(2) => m.resource_version = map.next_value()?,
                Some(3) if S::CALICO_ANNOTATIONS => m.annotations = map.next_value_seed(CalicoAnnotations)?,
                _ => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(m)
    }
}

/// `metadata.annotations` of a Node: only the `projectcalico.org/*` ones (`None` for `null`).
struct CalicoAnnotations;

impl<'de> DeserializeSeed<'de> for CalicoAnnotations {
    type Value = Option<BTreeMap<String, String>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for CalicoAnnotations {
    type Value = Option<BTreeMap<String, String>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of annotations")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        /// A key kept (owned) only when it has the prefix.
        struct PrefixedKey;
        impl Visitor<'_> for PrefixedKey {
            type Value = Option<String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an annotation key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<String>, E> {
                Ok(v.starts_with(NODE_ANNOTATION_PREFIX).then(|| v.to_owned()))
            }
        }
        impl<'de> DeserializeSeed<'de> for PrefixedKey {
            type Value = Option<String>;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
                d.deserialize_str(self)
            }
        }
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key_seed(PrefixedKey)? {
            match key {
                Some(k) => drop(out.insert(k, map.next_value::<String>()?)),
                None => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(Some(out))
    }
}

/// What a [`MapOr`] does with a mapping.
trait PickMap<'de> {
    type Out: Default;
    fn pick<A: MapAccess<'de>>(self, map: A) -> Result<Self::Out, A::Error>;
}

/// Reads a mapping with `P`; anything else is skipped and reads as `P::Out::default()`.
#[derive(Clone, Copy)]
struct MapOr<P>(P);

/// Reads a sequence of `P`s; anything else is skipped and reads as an empty list.
#[derive(Clone, Copy)]
struct SeqOr<P>(P);

/// The value of one key (seeded by `T`); `None` when absent. The last one wins.
#[derive(Clone, Copy)]
struct Key<T>(&'static str, T);

/// The listed keys, values whole.
#[derive(Clone, Copy)]
struct Keep(&'static [&'static str]);

impl<'de, T: DeserializeSeed<'de> + Copy> PickMap<'de> for Key<T> {
    type Out = Option<T::Value>;
    fn pick<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        let mut out = None;
        while let Some(key) = map.next_key_seed(KeyIndex(std::slice::from_ref(&self.0)))? {
            if key.is_some() {
                out = Some(map.next_value_seed(self.1)?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(out)
    }
}

impl<'de> PickMap<'de> for Keep {
    type Out = Mapping;
    fn pick<A: MapAccess<'de>>(self, mut map: A) -> Result<Mapping, A::Error> {
        let mut out = Mapping::new();
        while let Some(key) = map.next_key_seed(KeyIndex(self.0))? {
            match key {
                Some(i) => drop(out.insert(self.0[i].into(), map.next_value::<Value>()?)),
                None => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(out)
    }
}

/// The visitor methods of a value that is not the one looked for: skipped, read as the
/// default.
macro_rules! skip_others {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    };
}

impl<'de, P: PickMap<'de>> Visitor<'de> for MapOr<P> {
    type Value = P::Out;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    skip_others!();
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<P::Out, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(P::Out::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<P::Out, A::Error> {
        self.0.pick(map)
    }
}

impl<'de, P: PickMap<'de>> DeserializeSeed<'de> for MapOr<P> {
    type Value = P::Out;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<P::Out, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, P: PickMap<'de, Out = Mapping> + Copy> Visitor<'de> for SeqOr<MapOr<P>> {
    type Value = Vec<Value>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    skip_others!();
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Value>, A::Error> {
        let mut out = Vec::new();
        while let Some(m) = seq.next_element_seed(self.0)? {
            out.push(Value::Mapping(m));
        }
        Ok(out)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<Value>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Vec::new())
    }
}

impl<'de, P: PickMap<'de, Out = Mapping> + Copy> DeserializeSeed<'de> for SeqOr<MapOr<P>> {
    type Value = Vec<Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Value>, D::Error> {
        d.deserialize_any(self)
    }
}
