//! DescribeClientQuotas (key 48) and AlterClientQuotas (key 49): the
//! byte-rate quotas of [`crate::quota`], for `user` and `client-id`
//! entities and their defaults. Other entity types (`ip`) and other keys
//! (`request_percentage`, `controller_mutation_rate`, connection rates) are
//! refused with INVALID_REQUEST: kaas does not enforce them.

use super::super::{s, Reply};
use crate::api::error::ApiError;
use crate::quota::KEYS;
use crate::state::Broker;
use futures::FutureExt;
use kaas_actors::topic::AlterQuotas;
use kaas_protocol::kafka_protocol::messages::alter_client_quotas_response::{
    EntityData as AlterEntity, EntryData as AlterEntry,
};
use kaas_protocol::kafka_protocol::messages::describe_client_quotas_response::{
    EntityData, EntryData, ValueData,
};
use kaas_protocol::kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use kaas_protocol::kafka_protocol::ResponseError;
use kaas_volume::quotas::{Entity, Quotas};
use std::sync::Arc;

const TYPES: &[&str] = &["client-id", "user"];

/// One entity's operations: (quota key, new value or `None` to remove).
type Ops = Vec<(String, Option<f64>)>;

/// An entity as the request names it, sorted by type; refused if a type
/// is not served or repeated.
fn entity(parts: impl Iterator<Item = (String, Option<String>)>) -> Result<Entity, String> {
    let mut e: Entity = parts.collect();
    e.sort();
    for w in e.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(format!("entity type {} given twice", w[0].0));
        }
    }
    if e.is_empty() {
        return Err("empty entity".into());
    }
    if let Some((t, _)) = e.iter().find(|(t, _)| !TYPES.contains(&t.as_str())) {
        return Err(format!(
            "entity type {t} is not supported (only user and client-id)"
        ));
    }
    Ok(e)
}

/// Whether `e` matches the filter `components` (match type 0 exact, 1
/// default, 2 any), strictly or not.
fn matches(e: &Entity, components: &[(String, i8, Option<String>)], strict: bool) -> bool {
    if strict && e.len() != components.len() {
        return false;
    }
    components.iter().all(|(t, how, name)| {
        e.iter().any(|(et, en)| {
            et == t
                && match how {
                    0 => en == name,
                    1 => en.is_none(),
                    _ => true,
                }
        })
    })
}

/// DescribeClientQuotas: the quotas in force on the volume.
pub async fn describe(
    b: &Arc<Broker>,
    _v: i16,
    r: DescribeClientQuotasRequest,
) -> Reply<DescribeClientQuotasResponse> {
    let mut resp = DescribeClientQuotasResponse::default();
    let mut comps = Vec::new();
    for c in &r.components {
        let t = c.entity_type.to_string();
        if !TYPES.contains(&t.as_str()) || !(0..=2).contains(&c.match_type) {
            resp.error_code = ResponseError::InvalidRequest.code();
            resp.error_message = Some(s(&format!(
                "unsupported filter: entity type {t}, match type {}",
                c.match_type
            )));
            return Reply::Now(resp);
        }
        comps.push((t, c.match_type, c._match.as_ref().map(|m| m.to_string())));
    }
    let q = b.quotas.current();
    let entries = q
        .entries
        .iter()
        .filter(|(e, _)| matches(e, &comps, r.strict))
        .map(|(e, vals)| {
            let mut x = EntryData::default();
            x.entity = e
                .iter()
                .map(|(t, n)| {
                    let mut d = EntityData::default();
                    d.entity_type = s(t);
                    d.entity_name = n.as_deref().map(s);
                    d
                })
                .collect();
            x.values = vals
                .iter()
                .map(|(k, v)| {
                    let mut d = ValueData::default();
                    d.key = s(k);
                    d.value = *v;
                    d
                })
                .collect();
            x
        })
        .collect();
    resp.entries = Some(entries);
    Reply::Now(resp)
}

/// AlterClientQuotas: validate every entry, then write the valid ones as
/// one new version (validate_only writes nothing).
pub async fn alter(
    b: &Arc<Broker>,
    _v: i16,
    r: AlterClientQuotasRequest,
) -> Reply<AlterClientQuotasResponse> {
    let b = b.clone();
    Reply::Later(
        async move {
            let mut resp = AlterClientQuotasResponse::default();
            let mut ok: Vec<(usize, Entity, Ops)> = Vec::new();
            for (i, en) in r.entries.iter().enumerate() {
                let mut out = AlterEntry::default();
                out.entity = en
                    .entity
                    .iter()
                    .map(|d| {
                        let mut x = AlterEntity::default();
                        x.entity_type = d.entity_type.clone();
                        x.entity_name = d.entity_name.clone();
                        x
                    })
                    .collect();
                let checked = entity(en.entity.iter().map(|d| {
                    (
                        d.entity_type.to_string(),
                        d.entity_name.as_ref().map(|n| n.to_string()),
                    )
                }))
                .and_then(|e| {
                    let mut ops = Vec::new();
                    for op in &en.ops {
                        let k = op.key.to_string();
                        if !KEYS.contains(&k.as_str()) {
                            return Err(format!("quota {k} is not supported (only {KEYS:?})"));
                        }
                        let positive = op.value.is_finite() && op.value > 0.0;
                        if !op.remove && !positive {
                            return Err(format!("quota {k} must be a positive number"));
                        }
                        ops.push((k, (!op.remove).then_some(op.value)));
                    }
                    Ok((e, ops))
                });
                match checked {
                    Ok((e, ops)) => ok.push((i, e, ops)),
                    Err(m) => {
                        out.error_code = ResponseError::InvalidRequest.code();
                        out.error_message = Some(s(&m));
                    }
                }
                resp.entries.push(out);
            }
            if r.validate_only || ok.is_empty() {
                return resp;
            }
            let changes: Vec<(Entity, Ops)> =
                ok.iter().map(|(_, e, o)| (e.clone(), o.clone())).collect();
            let change = move |q: &mut Quotas| {
                for (e, ops) in &changes {
                    for (k, v) in ops {
                        q.set(e, k, *v);
                    }
                }
                Ok(())
            };
            let dir = b.args.cluster_dir().join(kaas_volume::layout::QUOTAS_DIR);
            let res = b
                .catalog
                .send(AlterQuotas {
                    dir,
                    change: Box::new(change),
                })
                .await;
            let err = match res {
                Ok(Ok(q)) => {
                    // In force here at once; the other brokers within a
                    // reload interval.
                    b.quotas.install(q);
                    None
                }
                Ok(Err(m)) => Some((ApiError::from(ResponseError::KafkaStorageError), m)),
                Err(_) => Some((ApiError::catalog_gone(), "topic catalog unavailable".into())),
            };
            if let Some((e, m)) = err {
                for (i, _, _) in ok {
                    resp.entries[i].error_code = e.code();
                    resp.entries[i].error_message = Some(s(&m));
                }
            }
            resp
        }
        .boxed(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_are_checked_and_filters_match_as_kafka_does() {
        let e = entity(
            [
                ("user".to_string(), None),
                ("client-id".to_string(), Some("a".to_string())),
            ]
            .into_iter(),
        )
        .unwrap();
        assert_eq!(e[0].0, "client-id", "sorted by type");
        assert!(entity([("ip".to_string(), None)].into_iter()).is_err());
        assert!(
            entity([("user".to_string(), None), ("user".to_string(), None)].into_iter()).is_err()
        );
        let exact = vec![("client-id".to_string(), 0i8, Some("a".to_string()))];
        assert!(matches(&e, &exact, false));
        assert!(!matches(&e, &exact, true), "strict: the user part is extra");
        let default_user = vec![("user".to_string(), 1i8, None)];
        assert!(matches(&e, &default_user, false));
        let any = vec![("client-id".to_string(), 2i8, None)];
        assert!(matches(&e, &any, false));
        let other = vec![("client-id".to_string(), 0i8, Some("b".to_string()))];
        assert!(!matches(&e, &other, false));
    }
}
