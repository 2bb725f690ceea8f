//! Leader-epoch claims: `leader-e<E>.claim` in a partition directory,
//! created with O_CREAT|O_EXCL by the one leader that may write epoch `E`.
//!
//! The epoch in a segment's name is the fencing token of the whole log
//! (substrate contract, rule 3) — but only if no two leaders ever write
//! under the same epoch. The controller's assignment is what hands epochs
//! out, and a deposed controller's late write of it cannot be prevented
//! (the substrate has no compare-and-swap). So the storage enforces it too:
//! before a leader writes anything of epoch `E` it wins the exclusive create
//! of `leader-e<E>.claim` (guarantee 2), with its broker id and incarnation
//! inside. A second leader granted the same epoch finds the claim, is fenced,
//! and reports the owner, so the controller can release that owner first
//! and grant a higher epoch.
//!
//! Lost replies (DESIGN §11): an EEXIST for a create that in fact succeeded
//! leaves an empty file. Only a claim whose content names us is ours; an
//! empty or foreign one is not, and the grant moves to a higher epoch — one
//! wasted epoch, never two writers.
//!
//! Four questions: (1) one exclusive create, then write + fsync of its
//! content; (2) a crash between create and write leaves an empty claim
//! that nobody treats as theirs (re-driven by a grant at epoch + 1);
//! (3) the claim is the single-writer fence itself; (4) the name carries the
//! epoch, the content the owner's identity.
//!
//! Winning the claim is the only way to an [`EpochWriter`], the capability
//! every later write of the epoch goes through: it cannot be cloned, only
//! this module mints one ([`win`]), and its seam refuses every write once
//! the broker's lease lapsed.

use kaas_volume::fs::{Fs, GuardedFs, SharedFs, WriteGuard};
use kaas_volume::identity::{self, create_with_identity, Found, JsonIdentity, Policy};
use kaas_volume::layout;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Who claims an epoch: a broker process's life, not just its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimOwner {
    /// Broker id.
    pub broker_id: i32,
    /// That broker process's incarnation.
    pub incarnation: u64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Claim {
    epoch: i32,
    #[serde(flatten)]
    owner: ClaimOwner,
}

impl JsonIdentity for Claim {}

/// Outcome of [`claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// The epoch is ours (just created, or created by us before).
    Ours,
    /// Somebody else holds it; `None` if its content is empty or unreadable
    /// (a claimant that crashed, or a lost reply).
    Taken(Option<ClaimOwner>),
}

/// File name of the claim on `epoch`.
pub use layout::leader_claim as claim_name;
/// Inverse of [`claim_name`].
pub use layout::parse_leader_claim as parse_claim_name;

/// Read the owner of the claim on `epoch` in `dir`: `Ok(None)` if there is
/// no claim, `Ok(Some(None))` if it is empty or unreadable.
pub fn owner_of(fs: &dyn Fs, dir: &Path, epoch: i32) -> io::Result<Option<Option<ClaimOwner>>> {
    Ok(
        match identity::read_identity::<Claim>(fs, &dir.join(claim_name(epoch)))? {
            Found::Absent => None,
            Found::Empty => Some(None),
            Found::Identity(c) => Some((c.epoch == epoch).then_some(c.owner)),
        },
    )
}

/// Claim `epoch` of the partition in `dir` (which must exist) for `owner`.
/// `Ours` only once the claim is durable. The lost-reply policy is the
/// primitive's ([`kaas_volume::identity`]); an empty claim after the re-read
/// window (a crashed claimant, or our own create whose reply was lost) is
/// not ours: the open is fenced and the grant moves to a higher epoch.
pub fn claim(fs: &dyn Fs, dir: &Path, epoch: i32, owner: ClaimOwner) -> io::Result<Claimed> {
    let me = Claim { epoch, owner };
    Ok(
        match create_with_identity(fs, &dir.join(claim_name(epoch)), &me, Policy::DURABLE)? {
            identity::Claimed::Won | identity::Claimed::Ours => Claimed::Ours,
            identity::Claimed::Taken(c) => Claimed::Taken((c.epoch == epoch).then_some(c.owner)),
            // Empty, or removed between our create and our read (the sweep
            // of a much later leader): certainly not ours to write.
            identity::Claimed::Indeterminate(_) => Claimed::Taken(None),
        },
    )
}

/// The right to write epoch `E` of one partition: handed out only by
/// winning `leader-e<E>.claim` ([`win`]) and moved into the log that owns
/// the files. Not `Clone`. Its seam is guarded: once the lease of the
/// incarnation that won lapses, every write through it is refused
/// ([`kaas_volume::fs::is_fenced`]) before it reaches the volume.
pub struct EpochWriter {
    fs: SharedFs,
    epoch: i32,
}

impl EpochWriter {
    /// The guarded seam the owner writes through.
    pub(crate) fn fs(&self) -> &dyn Fs {
        self.fs.as_ref()
    }

    /// The guarded seam, for an owner whose file layer holds its own handle
    /// (a coordinator shard's log); it stays lease-guarded.
    pub(crate) fn shared(&self) -> SharedFs {
        self.fs.clone()
    }

    /// The epoch this writer may write.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }
}

impl std::fmt::Debug for EpochWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EpochWriter(e{})", self.epoch)
    }
}

/// Claim `epoch` of the partition in `dir` for `owner` through `fs` guarded
/// by `guard`: the writer if the claim is ours, else who holds it. The claim
/// itself is written through the guarded seam, so a lapsed lease claims
/// nothing. `owner` is `None` only for a single process's own log (unit
/// tests): no claim file, but still a guarded writer.
pub(crate) fn win(
    fs: &SharedFs,
    guard: Option<Arc<dyn WriteGuard>>,
    dir: &Path,
    epoch: i32,
    owner: Option<ClaimOwner>,
) -> io::Result<Result<EpochWriter, Option<ClaimOwner>>> {
    let fs = match guard {
        Some(g) => GuardedFs::shared(fs.clone(), g),
        None => fs.clone(),
    };
    if let Some(owner) = owner {
        if let Claimed::Taken(by) = claim(fs.as_ref(), dir, epoch, owner)? {
            return Ok(Err(by));
        }
    }
    Ok(Ok(EpochWriter { fs, epoch }))
}
