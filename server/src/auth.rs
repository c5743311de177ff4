//! etcd's v3 auth: users, roles, key-range permissions and simple tokens.
//!
//! Owns one member's auth state and the rules etcd 3.4's `auth/store.go`
//! applies: every change arrives as an [`AuthRequest`] from the Raft log
//! and is applied here deterministically (passwords are hashed by the
//! proposer, so every member stores the same bytes), and the records to
//! persist come back as [`MetaChange`]s for the caller to write in the
//! entry's batch. Tokens are per member and in memory, as etcd's simple
//! tokens: an Authenticate entry gives every member the same token.
//!
//! This module never touches the runtime, the log or the disk, and never
//! hashes passwords itself (bcrypt costs tens of milliseconds: the API
//! edge runs it off the shard's core).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message as _;

use crate::api::grpc::pb::authpb;
use crate::mvcc;

/// etcd's name for the all-powerful role (and the user that must hold it
/// before auth can be enabled).
pub const ROOT: &str = "root";

/// etcd's default `--auth-token-ttl`: a simple token lives this long after
/// its last use.
pub const TOKEN_TTL: Duration = Duration::from_secs(300);

/// How this member issues and checks tokens (`--auth-token`,
/// `--auth-token-ttl`): member configuration, never replicated state.
#[derive(Debug, Clone)]
pub struct TokenSettings {
    pub kind: crate::jwt::TokenKind,
    /// How long a simple token lives after its last use.
    pub simple_ttl: Duration,
}

impl Default for TokenSettings {
    fn default() -> Self {
        TokenSettings {
            kind: crate::jwt::TokenKind::Simple,
            simple_ttl: TOKEN_TTL,
        }
    }
}

/// etcd's errors, with etcd's messages (clients match on them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    /// A write checked against an auth state that changed before the
    /// write applied: the client re-authenticates and retries.
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
    /// etcd 3.4's Maintenance service returns the auth package's errors
    /// untranslated (gRPC Unknown, `auth: ...`): `Hash`, `HashKV`,
    /// `Snapshot` and `Defragment` for a caller who is not root.
    #[error("auth: {}", .0.raw_message())]
    Maintenance(MaintenanceAuth),
    /// A JWT this member cannot issue (etcd's text, gRPC Unknown).
    #[error("{0}")]
    TokenSigning(crate::jwt::SignError),
}

/// The untranslated auth errors etcd's Maintenance service answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaintenanceAuth {
    UserEmpty,
    PermissionDenied,
    InvalidAuthToken,
}

impl MaintenanceAuth {
    fn raw_message(self) -> &'static str {
        match self {
            MaintenanceAuth::UserEmpty => "user name is empty",
            MaintenanceAuth::PermissionDenied => "permission denied",
            MaintenanceAuth::InvalidAuthToken => "invalid auth token",
        }
    }
}

impl AuthError {
    /// The same refusal as etcd's Maintenance service words it.
    pub fn for_maintenance(self) -> AuthError {
        match self {
            AuthError::UserEmpty => AuthError::Maintenance(MaintenanceAuth::UserEmpty),
            AuthError::InvalidAuthToken => {
                AuthError::Maintenance(MaintenanceAuth::InvalidAuthToken)
            }
            AuthError::PermissionDenied => {
                AuthError::Maintenance(MaintenanceAuth::PermissionDenied)
            }
            other => other,
        }
    }
}

/// What stands for a token when a verified client certificate names the
/// user (`--client-cert-auth`, no token sent): a NUL, which no header a
/// client sends can carry (HTTP/2 and HTTP/1 header values refuse it), so
/// no client can forge one.
const CERTIFICATE_USER: &str = "\0cert-user:";

/// The stand-in token of the user a verified client certificate names.
pub fn certificate_user_token(user: &str) -> String {
    format!("{CERTIFICATE_USER}{user}")
}

/// etcd's permission types (the `authpb.Permission.Type` numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermType {
    Read = 0,
    Write = 1,
    ReadWrite = 2,
}

impl PermType {
    pub fn from_i32(v: i32) -> Option<PermType> {
        match v {
            0 => Some(PermType::Read),
            1 => Some(PermType::Write),
            2 => Some(PermType::ReadWrite),
            _ => None,
        }
    }

    fn allows(self, need: Access) -> bool {
        matches!(
            (self, need),
            (PermType::ReadWrite, _)
                | (PermType::Read, Access::Read)
                | (PermType::Write, Access::Write)
        )
    }
}

/// What a request needs on a key range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// One permission need: `access` on `[key, range_end)` (an empty
/// `range_end` is the single key, `"\0"` everything from `key` on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub access: Access,
    pub key: Bytes,
    pub range_end: Bytes,
}

/// What the caller of a request must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// Key-range permissions (KV, Watch, LeaseRevoke); empty = any caller.
    Keys(Vec<Need>),
    /// A user with the root role (auth management).
    Admin,
    /// Root, or the named user itself (UserGet, as etcd 3.4).
    AdminOrUser(String),
    /// Root, or a user holding the named role (RoleGet, as etcd 3.4).
    AdminOrRoleHolder(String),
}

impl Need {
    fn of(access: Access, key: &Bytes, range_end: &Bytes) -> Need {
        Need {
            access,
            key: key.clone(),
            range_end: range_end.clone(),
        }
    }

    /// Write on the single key `key` (a lease's attached key).
    pub fn write(key: &Bytes) -> Need {
        Need::of(Access::Write, key, &Bytes::new())
    }

    /// Read on `[key, range_end)`.
    pub fn read(key: &Bytes, range_end: &Bytes) -> Need {
        Need::of(Access::Read, key, range_end)
    }
}

/// What a KV request needs, as etcd 3.4 checks it: read for a range;
/// write for a put (and read with `prev_kv`); write for a delete (and
/// read with `prev_kv`); for a txn, read for every compare and range and
/// the above for every put and delete of both branches, nested txns
/// included (`checkTxnReqsPermission`). A compaction needs nothing.
pub fn kv_needs(req: &mvcc::Request, out: &mut Vec<Need>) {
    match req {
        mvcc::Request::Put(p) => put_needs(p, out),
        mvcc::Request::DeleteRange(d) => delete_needs(d, out),
        mvcc::Request::Txn(t) => txn_needs(t, out),
        mvcc::Request::Compaction(_) => {}
    }
}

fn put_needs(p: &mvcc::PutRequest, out: &mut Vec<Need>) {
    out.push(Need::write(&p.key));
    if p.prev_kv {
        out.push(Need::read(&p.key, &Bytes::new()));
    }
}

fn delete_needs(d: &mvcc::DeleteRangeRequest, out: &mut Vec<Need>) {
    out.push(Need::of(Access::Write, &d.key, &d.range_end));
    if d.prev_kv {
        out.push(Need::read(&d.key, &d.range_end));
    }
}

pub fn txn_needs(t: &mvcc::TxnRequest, out: &mut Vec<Need>) {
    for c in &t.compare {
        out.push(Need::read(&c.key, &c.range_end));
    }
    for op in t.success.iter().chain(&t.failure) {
        match op {
            mvcc::RequestOp::Range(r) => out.push(Need::read(&r.key, &r.range_end)),
            mvcc::RequestOp::Put(p) => put_needs(p, out),
            mvcc::RequestOp::DeleteRange(d) => delete_needs(d, out),
            mvcc::RequestOp::Txn(t) => txn_needs(t, out),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPermission {
    pub perm_type: PermType,
    pub key: Bytes,
    pub range_end: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    /// bcrypt hash; empty for a user added with `--no-password`.
    pub password: Bytes,
    /// Sorted, as etcd keeps them.
    pub roles: Vec<String>,
    pub no_password: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Role {
    /// Sorted by key, as etcd keeps them.
    pub perms: Vec<KeyPermission>,
}

/// A change of the auth state, as it travels in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthRequest {
    Enable,
    Disable,
    Authenticate {
        name: String,
        /// The random part; the entry's index is appended, as etcd's.
        token_prefix: String,
    },
    UserAdd {
        name: String,
        hashed_password: Bytes,
        no_password: bool,
    },
    UserDelete {
        name: String,
    },
    UserChangePassword {
        name: String,
        hashed_password: Bytes,
    },
    UserGrantRole {
        user: String,
        role: String,
    },
    UserRevokeRole {
        name: String,
        role: String,
    },
    RoleAdd {
        name: String,
    },
    RoleDelete {
        role: String,
    },
    RoleGrantPermission {
        name: String,
        perm: KeyPermission,
    },
    RoleRevokePermission {
        role: String,
        key: Bytes,
        range_end: Bytes,
    },
}

/// A read of the auth state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthQuery {
    /// The hash to check a login's password against (no caller needed).
    PasswordHash(String),
    UserGet(String),
    UserList,
    RoleGet(String),
    RoleList,
    Status,
}

impl AuthQuery {
    /// What the caller must be: root for listing users and roles; root or
    /// the user itself to read a user, root or a holder to read a role.
    pub fn requirement(&self) -> Requirement {
        match self {
            AuthQuery::PasswordHash(_) | AuthQuery::Status => Requirement::Keys(Vec::new()),
            AuthQuery::UserGet(name) => Requirement::AdminOrUser(name.clone()),
            AuthQuery::RoleGet(role) => Requirement::AdminOrRoleHolder(role.clone()),
            AuthQuery::UserList | AuthQuery::RoleList => Requirement::Admin,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthAnswer {
    PasswordHash(Bytes),
    /// A user's roles.
    Roles(Vec<String>),
    /// User or role names, sorted.
    Names(Vec<String>),
    Permissions(Vec<KeyPermission>),
    Status {
        enabled: bool,
        revision: u64,
    },
}

/// What an applied [`AuthRequest`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthApplied {
    Done,
    Token(String),
}

/// A record to write (`Some`) or delete (`None`) in the metadata namespace,
/// in the same batch as the entry's applied index.
pub type MetaChange = (Vec<u8>, Option<Bytes>);

pub(crate) const META_ENABLED: &[u8] = b"auth/enabled";
pub(crate) const META_REVISION: &[u8] = b"auth/revision";
pub(crate) const META_USER: &[u8] = b"auth/user/";
pub(crate) const META_ROLE: &[u8] = b"auth/role/";
/// Every auth record's name starts with this.
pub const META_PREFIX: &[u8] = b"auth/";

/// One member's auth state.
#[derive(Debug, Default)]
pub struct AuthStore {
    enabled: bool,
    /// Bumped by every change, as etcd's auth revision.
    revision: u64,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
    /// Simple tokens; always empty with JWTs.
    tokens: HashMap<String, Token>,
    token_settings: TokenSettings,
}

#[derive(Debug)]
struct Token {
    user: String,
    expires: Instant,
}

impl AuthStore {
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// This member's token configuration (set once at start; a snapshot
    /// install keeps it, see [`AuthStore::adopt_tokens`]).
    pub fn set_token_settings(&mut self, settings: TokenSettings) {
        self.token_settings = settings;
    }

    /// Rebuilds the state from its metadata records (names without the
    /// namespace byte, as [`MetaChange`]s wrote them).
    pub fn restore(records: &[(Bytes, Bytes)]) -> Result<AuthStore, String> {
        // etcd's auth store starts at revision 1 (it writes that at its
        // first start; metcd only at the first change).
        let mut s = AuthStore {
            revision: 1,
            ..AuthStore::default()
        };
        for (name, value) in records {
            if name[..] == *META_ENABLED {
                s.enabled = value.first() == Some(&1);
            } else if name[..] == *META_REVISION {
                let raw = <[u8; 8]>::try_from(&value[..])
                    .map_err(|_| format!("bad auth revision record {value:02x?}"))?;
                s.revision = u64::from_be_bytes(raw);
            } else if let Some(user) = name.strip_prefix(META_USER) {
                let pb = authpb::User::decode(&value[..])
                    .map_err(|e| format!("bad auth user record: {e}"))?;
                s.users.insert(utf8(user)?, user_from_pb(pb));
            } else if let Some(role) = name.strip_prefix(META_ROLE) {
                let pb = authpb::Role::decode(&value[..])
                    .map_err(|e| format!("bad auth role record: {e}"))?;
                s.roles.insert(utf8(role)?, role_from_pb(pb)?);
            } else {
                return Err(format!("unknown auth record {name:02x?}"));
            }
        }
        Ok(s)
    }

    /// The user behind a request's token (`None`: no token sent). With
    /// auth disabled nobody is anybody and every token is ignored.
    /// `for_keys`: the request needs key permissions, the one check where
    /// etcd refuses a JWT issued before the last auth change (admin
    /// requests and those needing nothing take it).
    pub fn user_of(
        &mut self,
        token: Option<&str>,
        now: Instant,
        for_keys: bool,
    ) -> Result<Option<String>, AuthError> {
        if !self.enabled {
            return Ok(None);
        }
        let Some(token) = token else {
            return Ok(None);
        };
        if let Some(user) = token.strip_prefix(CERTIFICATE_USER) {
            return Ok(Some(user.to_string()));
        }
        if let crate::jwt::TokenKind::Jwt(jwt) = &self.token_settings.kind {
            // etcd: a JWT names the auth revision it was issued at; after
            // any auth change the client must log in again (clientv3 does
            // so by itself on this error).
            let (user, revision) = jwt.verify(token).ok_or(AuthError::InvalidAuthToken)?;
            if for_keys && revision < self.revision {
                return Err(AuthError::AuthOldRevision);
            }
            return Ok(Some(user));
        }
        let ttl = self.token_settings.simple_ttl;
        match self.tokens.get_mut(token) {
            Some(t) if t.expires > now => {
                t.expires = now + ttl;
                Ok(Some(t.user.clone()))
            }
            Some(_) => {
                self.tokens.remove(token);
                Err(AuthError::InvalidAuthToken)
            }
            None => Err(AuthError::InvalidAuthToken),
        }
    }

    /// Whether `user` (from [`AuthStore::user_of`]) may do what `req`
    /// needs; always yes with auth disabled.
    pub fn check(&self, user: Option<&str>, req: &Requirement) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        if let Requirement::Keys(needs) = req {
            if needs.is_empty() {
                return Ok(());
            }
        }
        let name = match user {
            Some(n) if !n.is_empty() => n,
            _ => return Err(AuthError::UserEmpty),
        };
        let Some(user) = self.users.get(name) else {
            return Err(AuthError::PermissionDenied);
        };
        if user.roles.iter().any(|r| r == ROOT) {
            return Ok(());
        }
        match req {
            Requirement::AdminOrUser(who) if who == name => Ok(()),
            Requirement::AdminOrRoleHolder(role) if user.roles.iter().any(|r| r == role) => Ok(()),
            Requirement::Admin
            | Requirement::AdminOrUser(_)
            | Requirement::AdminOrRoleHolder(_) => Err(AuthError::PermissionDenied),
            Requirement::Keys(needs) => {
                for need in needs {
                    if !self.covered(user, need) {
                        return Err(AuthError::PermissionDenied);
                    }
                }
                Ok(())
            }
        }
    }

    /// Whether the union of the user's permissions of the right type
    /// covers the whole of `need`'s range (a single key `k` is the range
    /// `[k, k\0)`, as etcd's interval tree has it).
    fn covered(&self, user: &User, need: &Need) -> bool {
        let mut spans: Vec<(&[u8], End)> = user
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| r.perms.iter())
            .filter(|p| p.perm_type.allows(need.access))
            .map(|p| (&p.key[..], End::of(&p.key, &p.range_end)))
            .collect();
        let want_end = End::of(&need.key, &need.range_end);
        if let End::Key(e) = &want_end {
            if e[..] <= need.key[..] {
                // An empty range reads and writes nothing.
                return true;
            }
        }
        spans.sort_by(|a, b| a.0.cmp(b.0));
        // Walk the spans in key order, extending the covered prefix
        // `[need.key, reached)` until it reaches the end or a gap shows.
        let mut reached: &[u8] = &need.key;
        for (begin, end) in &spans {
            if *begin > reached {
                break;
            }
            match end {
                End::Unbounded => return true,
                End::Key(e) => {
                    if e.as_slice() > reached {
                        reached = e;
                    }
                }
            }
            if let End::Key(w) = &want_end {
                if reached >= w.as_slice() {
                    return true;
                }
            }
        }
        false
    }

    /// Applies one change from the log; `index` is the entry's (it ends a
    /// simple token, as in etcd).
    pub fn apply(
        &mut self,
        req: &AuthRequest,
        index: u64,
        now: Instant,
    ) -> Result<(AuthApplied, Vec<MetaChange>), AuthError> {
        let mut changes = Vec::new();
        let answer = self.apply_inner(req, index, now, &mut changes)?;
        if !changes.is_empty() {
            self.revision += 1;
            changes.push((
                META_REVISION.to_vec(),
                Some(Bytes::copy_from_slice(&self.revision.to_be_bytes())),
            ));
        }
        Ok((answer, changes))
    }

    fn apply_inner(
        &mut self,
        req: &AuthRequest,
        index: u64,
        now: Instant,
        changes: &mut Vec<MetaChange>,
    ) -> Result<AuthApplied, AuthError> {
        match req {
            AuthRequest::Enable => {
                if self.enabled {
                    return Ok(AuthApplied::Done);
                }
                let root = self.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
                if !root.roles.iter().any(|r| r == ROOT) {
                    return Err(AuthError::RootRoleNotExist);
                }
                self.enabled = true;
                self.tokens.clear();
                changes.push((META_ENABLED.to_vec(), Some(Bytes::from_static(&[1]))));
            }
            AuthRequest::Disable => {
                if !self.enabled {
                    return Ok(AuthApplied::Done);
                }
                self.enabled = false;
                self.tokens.clear();
                changes.push((META_ENABLED.to_vec(), Some(Bytes::from_static(&[0]))));
            }
            AuthRequest::Authenticate { name, token_prefix } => {
                if !self.enabled {
                    return Err(AuthError::AuthNotEnabled);
                }
                if !self.users.contains_key(name) {
                    return Err(AuthError::AuthFailed);
                }
                if let crate::jwt::TokenKind::Jwt(jwt) = &self.token_settings.kind {
                    // Signed for the auth revision this login applies at.
                    return jwt
                        .sign(name, self.revision)
                        .map(AuthApplied::Token)
                        .map_err(AuthError::TokenSigning);
                }
                // Tokens idle past their TTL go here, not only when shown
                // again: a client that logs in and leaves costs nothing.
                self.tokens.retain(|_, t| t.expires > now);
                let token = format!("{token_prefix}.{index}");
                self.tokens.insert(
                    token.clone(),
                    Token {
                        user: name.clone(),
                        expires: now + self.token_settings.simple_ttl,
                    },
                );
                return Ok(AuthApplied::Token(token));
            }
            AuthRequest::UserAdd {
                name,
                hashed_password,
                no_password,
            } => {
                if name.is_empty() {
                    return Err(AuthError::UserEmpty);
                }
                if self.users.contains_key(name) {
                    return Err(AuthError::UserAlreadyExist);
                }
                let user = User {
                    password: if *no_password {
                        Bytes::new()
                    } else {
                        hashed_password.clone()
                    },
                    roles: Vec::new(),
                    no_password: *no_password,
                };
                self.put_user(name, user, changes);
            }
            AuthRequest::UserDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                if self.users.remove(name).is_none() {
                    return Err(AuthError::UserNotFound);
                }
                self.forget_tokens_of(name);
                changes.push((record_name(META_USER, name), None));
            }
            AuthRequest::UserChangePassword {
                name,
                hashed_password,
            } => {
                let mut user = self
                    .users
                    .get(name)
                    .cloned()
                    .ok_or(AuthError::UserNotFound)?;
                user.password = hashed_password.clone();
                self.forget_tokens_of(name);
                self.put_user(name, user, changes);
            }
            AuthRequest::UserGrantRole { user, role } => {
                let mut u = self
                    .users
                    .get(user)
                    .cloned()
                    .ok_or(AuthError::UserNotFound)?;
                if role != ROOT && !self.roles.contains_key(role) {
                    return Err(AuthError::RoleNotFound);
                }
                if let Err(at) = u.roles.binary_search(role) {
                    u.roles.insert(at, role.clone());
                    self.put_user(user, u, changes);
                }
            }
            AuthRequest::UserRevokeRole { name, role } => {
                if self.enabled && name == ROOT && role == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                let mut u = self
                    .users
                    .get(name)
                    .cloned()
                    .ok_or(AuthError::UserNotFound)?;
                let at = u
                    .roles
                    .binary_search(role)
                    .map_err(|_| AuthError::RoleNotGranted)?;
                u.roles.remove(at);
                self.put_user(name, u, changes);
            }
            AuthRequest::RoleAdd { name } => {
                if name.is_empty() {
                    return Err(AuthError::RoleEmpty);
                }
                if self.roles.contains_key(name) {
                    return Err(AuthError::RoleAlreadyExist);
                }
                self.put_role(name, Role::default(), changes);
            }
            AuthRequest::RoleDelete { role } => {
                if self.enabled && role == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                if self.roles.remove(role).is_none() {
                    return Err(AuthError::RoleNotFound);
                }
                changes.push((record_name(META_ROLE, role), None));
                let holders: Vec<String> = self
                    .users
                    .iter()
                    .filter(|(_, u)| u.roles.iter().any(|r| r == role))
                    .map(|(n, _)| n.clone())
                    .collect();
                for name in holders {
                    if let Some(mut u) = self.users.get(&name).cloned() {
                        u.roles.retain(|r| r != role);
                        self.put_user(&name, u, changes);
                    }
                }
            }
            AuthRequest::RoleGrantPermission { name, perm } => {
                let mut role = self
                    .roles
                    .get(name)
                    .cloned()
                    .ok_or(AuthError::RoleNotFound)?;
                match role
                    .perms
                    .iter_mut()
                    .find(|p| p.key == perm.key && p.range_end == perm.range_end)
                {
                    Some(existing) => existing.perm_type = perm.perm_type,
                    None => {
                        let at = role.perms.partition_point(|p| p.key <= perm.key);
                        role.perms.insert(at, perm.clone());
                    }
                }
                self.put_role(name, role, changes);
            }
            AuthRequest::RoleRevokePermission {
                role,
                key,
                range_end,
            } => {
                let mut r = self
                    .roles
                    .get(role)
                    .cloned()
                    .ok_or(AuthError::RoleNotFound)?;
                let before = r.perms.len();
                r.perms
                    .retain(|p| !(p.key == *key && p.range_end == *range_end));
                if r.perms.len() == before {
                    return Err(AuthError::PermissionNotGranted);
                }
                self.put_role(role, r, changes);
            }
        }
        Ok(AuthApplied::Done)
    }

    fn put_user(&mut self, name: &str, user: User, changes: &mut Vec<MetaChange>) {
        let pb = authpb::User {
            name: Bytes::copy_from_slice(name.as_bytes()),
            password: user.password.clone(),
            roles: user.roles.clone(),
            options: Some(authpb::UserAddOptions {
                no_password: user.no_password,
            }),
        };
        changes.push((
            record_name(META_USER, name),
            Some(Bytes::from(pb.encode_to_vec())),
        ));
        self.users.insert(name.to_string(), user);
    }

    fn put_role(&mut self, name: &str, role: Role, changes: &mut Vec<MetaChange>) {
        let pb = role_pb(name, &role);
        changes.push((
            record_name(META_ROLE, name),
            Some(Bytes::from(pb.encode_to_vec())),
        ));
        self.roles.insert(name.to_string(), role);
    }

    /// Keeps this member's token settings and the simple tokens of
    /// `previous` (the state a snapshot install replaces) whose users still exist here with the same password, as
    /// etcd keeps its tokens across a snapshot: a client's login survives
    /// its member catching up, unless what the snapshot skipped would have
    /// ended it (the user deleted, the password changed, auth turned off).
    pub fn adopt_tokens(&mut self, previous: AuthStore) {
        self.token_settings = previous.token_settings.clone();
        if !self.enabled || !previous.enabled {
            return;
        }
        let (users, before) = (&self.users, &previous.users);
        let same_user = |name: &str| match (users.get(name), before.get(name)) {
            (Some(now), Some(then)) => now.password == then.password,
            _ => false,
        };
        self.tokens.extend(
            previous
                .tokens
                .into_iter()
                .filter(|(_, t)| same_user(&t.user)),
        );
    }

    fn forget_tokens_of(&mut self, name: &str) {
        self.tokens.retain(|_, t| t.user != name);
    }

    /// The stored password hash to check a login against (`AuthFailed`
    /// for an unknown user or one without a password).
    pub fn password_hash(&self, name: &str) -> Result<Bytes, AuthError> {
        if !self.enabled {
            return Err(AuthError::AuthNotEnabled);
        }
        match self.users.get(name) {
            Some(u) if !u.no_password => Ok(u.password.clone()),
            _ => Err(AuthError::AuthFailed),
        }
    }

    /// Answers a read (the caller's rights are checked by the caller).
    pub fn query(&self, q: &AuthQuery) -> Result<AuthAnswer, AuthError> {
        Ok(match q {
            AuthQuery::PasswordHash(name) => AuthAnswer::PasswordHash(self.password_hash(name)?),
            AuthQuery::UserGet(name) => AuthAnswer::Roles(
                self.users
                    .get(name)
                    .ok_or(AuthError::UserNotFound)?
                    .roles
                    .clone(),
            ),
            AuthQuery::UserList => AuthAnswer::Names(self.users.keys().cloned().collect()),
            AuthQuery::RoleGet(name) => AuthAnswer::Permissions(self.role(name)?.perms.clone()),
            AuthQuery::RoleList => AuthAnswer::Names(self.roles.keys().cloned().collect()),
            AuthQuery::Status => AuthAnswer::Status {
                enabled: self.enabled,
                revision: self.revision,
            },
        })
    }

    fn role(&self, name: &str) -> Result<&Role, AuthError> {
        self.roles.get(name).ok_or(AuthError::RoleNotFound)
    }
}

/// The exclusive end of a permission or request range, as etcd's
/// intervals: an empty `range_end` is the single key (ending at `key\0`,
/// its immediate successor), `"\0"` has no end.
#[derive(Debug, Clone)]
enum End {
    Key(Vec<u8>),
    Unbounded,
}

impl End {
    fn of(key: &[u8], range_end: &[u8]) -> End {
        match range_end {
            [] => End::Key(crate::mvcc::key_after(key)),
            [0] => End::Unbounded,
            e => End::Key(e.to_vec()),
        }
    }
}

fn record_name(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

fn utf8(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| format!("auth record name {b:02x?} is not UTF-8"))
}

fn user_from_pb(pb: authpb::User) -> User {
    let mut roles = pb.roles;
    roles.sort();
    User {
        password: pb.password,
        roles,
        no_password: pb.options.is_some_and(|o| o.no_password),
    }
}

fn role_from_pb(pb: authpb::Role) -> Result<Role, String> {
    let perms = pb
        .key_permission
        .into_iter()
        .map(|p| {
            Ok(KeyPermission {
                perm_type: PermType::from_i32(p.perm_type)
                    .ok_or_else(|| format!("bad permission type {}", p.perm_type))?,
                key: p.key,
                range_end: p.range_end,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(Role { perms })
}

/// A role as etcd's `authpb.Role` (RoleGet answers its permissions).
pub fn role_pb(name: &str, role: &Role) -> authpb::Role {
    authpb::Role {
        name: Bytes::copy_from_slice(name.as_bytes()),
        key_permission: role.perms.iter().map(permission_pb).collect(),
    }
}

pub fn permission_pb(p: &KeyPermission) -> authpb::Permission {
    authpb::Permission {
        perm_type: p.perm_type as i32,
        key: p.key.clone(),
        range_end: p.range_end.clone(),
    }
}

// ---------------------------------------------------------------------------
// Log encoding: `[u8 kind]` then length-prefixed fields.

const K_ENABLE: u8 = 1;
const K_DISABLE: u8 = 2;
const K_AUTHENTICATE: u8 = 3;
const K_USER_ADD: u8 = 4;
const K_USER_DELETE: u8 = 5;
const K_USER_PASSWORD: u8 = 6;
const K_USER_GRANT: u8 = 7;
const K_USER_REVOKE: u8 = 8;
const K_ROLE_ADD: u8 = 9;
const K_ROLE_DELETE: u8 = 10;
const K_ROLE_GRANT: u8 = 11;
const K_ROLE_REVOKE: u8 = 12;

pub fn encode(req: &AuthRequest, out: &mut Vec<u8>) {
    fn field(out: &mut Vec<u8>, b: &[u8]) {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    }
    match req {
        AuthRequest::Enable => out.push(K_ENABLE),
        AuthRequest::Disable => out.push(K_DISABLE),
        AuthRequest::Authenticate { name, token_prefix } => {
            out.push(K_AUTHENTICATE);
            field(out, name.as_bytes());
            field(out, token_prefix.as_bytes());
        }
        AuthRequest::UserAdd {
            name,
            hashed_password,
            no_password,
        } => {
            out.push(K_USER_ADD);
            field(out, name.as_bytes());
            field(out, hashed_password);
            out.push(u8::from(*no_password));
        }
        AuthRequest::UserDelete { name } => {
            out.push(K_USER_DELETE);
            field(out, name.as_bytes());
        }
        AuthRequest::UserChangePassword {
            name,
            hashed_password,
        } => {
            out.push(K_USER_PASSWORD);
            field(out, name.as_bytes());
            field(out, hashed_password);
        }
        AuthRequest::UserGrantRole { user, role } => {
            out.push(K_USER_GRANT);
            field(out, user.as_bytes());
            field(out, role.as_bytes());
        }
        AuthRequest::UserRevokeRole { name, role } => {
            out.push(K_USER_REVOKE);
            field(out, name.as_bytes());
            field(out, role.as_bytes());
        }
        AuthRequest::RoleAdd { name } => {
            out.push(K_ROLE_ADD);
            field(out, name.as_bytes());
        }
        AuthRequest::RoleDelete { role } => {
            out.push(K_ROLE_DELETE);
            field(out, role.as_bytes());
        }
        AuthRequest::RoleGrantPermission { name, perm } => {
            out.push(K_ROLE_GRANT);
            field(out, name.as_bytes());
            out.push(perm.perm_type as u8);
            field(out, &perm.key);
            field(out, &perm.range_end);
        }
        AuthRequest::RoleRevokePermission {
            role,
            key,
            range_end,
        } => {
            out.push(K_ROLE_REVOKE);
            field(out, role.as_bytes());
            field(out, key);
            field(out, range_end);
        }
    }
}

/// `None` for bytes [`encode`] cannot have produced.
pub fn decode(buf: &Bytes) -> Option<AuthRequest> {
    struct Reader<'a> {
        buf: &'a Bytes,
        at: usize,
    }
    impl Reader<'_> {
        fn byte(&mut self) -> Option<u8> {
            let b = *self.buf.get(self.at)?;
            self.at += 1;
            Some(b)
        }
        fn bytes(&mut self) -> Option<Bytes> {
            let len = self.buf.get(self.at..self.at + 4)?;
            let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
            let start = self.at + 4;
            let end = start.checked_add(len)?;
            if end > self.buf.len() {
                return None;
            }
            self.at = end;
            Some(self.buf.slice(start..end))
        }
        fn string(&mut self) -> Option<String> {
            String::from_utf8(self.bytes()?.to_vec()).ok()
        }
    }
    let mut r = Reader { buf, at: 0 };
    let req = match r.byte()? {
        K_ENABLE => AuthRequest::Enable,
        K_DISABLE => AuthRequest::Disable,
        K_AUTHENTICATE => AuthRequest::Authenticate {
            name: r.string()?,
            token_prefix: r.string()?,
        },
        K_USER_ADD => AuthRequest::UserAdd {
            name: r.string()?,
            hashed_password: r.bytes()?,
            no_password: r.byte()? == 1,
        },
        K_USER_DELETE => AuthRequest::UserDelete { name: r.string()? },
        K_USER_PASSWORD => AuthRequest::UserChangePassword {
            name: r.string()?,
            hashed_password: r.bytes()?,
        },
        K_USER_GRANT => AuthRequest::UserGrantRole {
            user: r.string()?,
            role: r.string()?,
        },
        K_USER_REVOKE => AuthRequest::UserRevokeRole {
            name: r.string()?,
            role: r.string()?,
        },
        K_ROLE_ADD => AuthRequest::RoleAdd { name: r.string()? },
        K_ROLE_DELETE => AuthRequest::RoleDelete { role: r.string()? },
        K_ROLE_GRANT => AuthRequest::RoleGrantPermission {
            name: r.string()?,
            perm: KeyPermission {
                perm_type: PermType::from_i32(i32::from(r.byte()?))?,
                key: r.bytes()?,
                range_end: r.bytes()?,
            },
        },
        K_ROLE_REVOKE => AuthRequest::RoleRevokePermission {
            role: r.string()?,
            key: r.bytes()?,
            range_end: r.bytes()?,
        },
        _ => return None,
    };
    (r.at == buf.len()).then_some(req)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn applied(s: &mut AuthStore, req: AuthRequest) -> Result<AuthApplied, AuthError> {
        s.apply(&req, 1, Instant::now()).map(|(a, _)| a)
    }

    fn grant(role: &str, t: PermType, key: &str, end: &str) -> AuthRequest {
        AuthRequest::RoleGrantPermission {
            name: role.into(),
            perm: KeyPermission {
                perm_type: t,
                key: b(key),
                range_end: b(end),
            },
        }
    }

    fn need(access: Access, key: &str, end: &str) -> Requirement {
        Requirement::Keys(vec![Need {
            access,
            key: b(key),
            range_end: b(end),
        }])
    }

    /// root + alice with a role `r` holding the given grants; auth on.
    fn store_with(grants: &[AuthRequest]) -> AuthStore {
        let mut s = AuthStore::default();
        for req in [
            AuthRequest::UserAdd {
                name: "root".into(),
                hashed_password: b("h"),
                no_password: false,
            },
            AuthRequest::UserGrantRole {
                user: "root".into(),
                role: ROOT.into(),
            },
            AuthRequest::UserAdd {
                name: "alice".into(),
                hashed_password: b("h"),
                no_password: false,
            },
            AuthRequest::RoleAdd { name: "r".into() },
            AuthRequest::UserGrantRole {
                user: "alice".into(),
                role: "r".into(),
            },
        ] {
            applied(&mut s, req).unwrap();
        }
        for g in grants {
            applied(&mut s, g.clone()).unwrap();
        }
        applied(&mut s, AuthRequest::Enable).unwrap();
        s
    }

    #[test]
    fn enable_needs_root_with_the_root_role() {
        let mut s = AuthStore::default();
        assert_eq!(
            applied(&mut s, AuthRequest::Enable),
            Err(AuthError::RootUserNotExist)
        );
        applied(
            &mut s,
            AuthRequest::UserAdd {
                name: "root".into(),
                hashed_password: b("h"),
                no_password: false,
            },
        )
        .unwrap();
        assert_eq!(
            applied(&mut s, AuthRequest::Enable),
            Err(AuthError::RootRoleNotExist)
        );
        assert!(!s.enabled());
    }

    /// etcd 3.4's UserGet and RoleGet: root reads anything; another user
    /// reads itself and the roles it holds, nothing else; lists are root's.
    #[test]
    fn users_read_themselves_and_their_roles() {
        let mut s = store_with(&[]);
        applied(&mut s, AuthRequest::RoleAdd { name: "q".into() }).unwrap();
        let may = |user: &str, q: AuthQuery| s.check(Some(user), &q.requirement());
        let denied = Err(AuthError::PermissionDenied);
        assert_eq!(may("alice", AuthQuery::UserGet("alice".into())), Ok(()));
        assert_eq!(may("alice", AuthQuery::UserGet("root".into())), denied);
        assert_eq!(may("alice", AuthQuery::RoleGet("r".into())), Ok(()));
        assert_eq!(may("alice", AuthQuery::RoleGet("q".into())), denied);
        assert_eq!(may("alice", AuthQuery::UserList), denied);
        assert_eq!(may("alice", AuthQuery::RoleList), denied);
        assert_eq!(may("root", AuthQuery::UserGet("alice".into())), Ok(()));
        assert_eq!(may("root", AuthQuery::RoleGet("q".into())), Ok(()));
        assert_eq!(
            s.check(None, &AuthQuery::UserGet("alice".into()).requirement()),
            Err(AuthError::UserEmpty)
        );
    }

    #[test]
    fn permissions_cover_points_ranges_and_prefixes() {
        let s = store_with(&[
            grant("r", PermType::Read, "foo", ""),
            grant("r", PermType::ReadWrite, "pub/", "pub0"),
            grant("r", PermType::Write, "a", "m"),
            grant("r", PermType::Read, "m", "p"),
            grant("r", PermType::Read, "x", "\0"),
        ]);
        let alice = Some("alice");
        let ok = |r: Requirement| s.check(alice, &r);
        assert_eq!(ok(need(Access::Read, "foo", "")), Ok(()));
        assert_eq!(
            ok(need(Access::Write, "foo", "")),
            Ok(()),
            "foo is in [a, m)"
        );
        assert_eq!(
            ok(need(Access::Read, "fo", "")),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(
            ok(need(Access::Read, "foo", "fop")),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(ok(need(Access::Read, "pub/", "pub0")), Ok(()));
        assert_eq!(ok(need(Access::Write, "pub/a", "pub/b")), Ok(()));
        assert_eq!(
            ok(need(Access::Read, "pub/", "pub1")),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(ok(need(Access::Read, "n", "")), Ok(()));
        assert_eq!(ok(need(Access::Read, "m", "p")), Ok(()));
        assert_eq!(ok(need(Access::Read, "x", "\0")), Ok(()));
        assert_eq!(ok(need(Access::Read, "y", "")), Ok(()));
        assert_eq!(
            ok(need(Access::Read, "w", "\0")),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(
            ok(need(Access::Write, "x", "")),
            Err(AuthError::PermissionDenied)
        );
        // Two adjacent write ranges together cover their union.
        let s = store_with(&[
            grant("r", PermType::Write, "a", "c"),
            grant("r", PermType::Write, "c", "e"),
        ]);
        assert_eq!(s.check(alice, &need(Access::Write, "b", "d")), Ok(()));
        assert_eq!(
            s.check(alice, &need(Access::Write, "b", "f")),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(
            s.check(None, &need(Access::Read, "a", "")),
            Err(AuthError::UserEmpty)
        );
        assert_eq!(s.check(Some("root"), &Requirement::Admin), Ok(()));
        assert_eq!(
            s.check(alice, &Requirement::Admin),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(
            s.check(Some("ghost"), &need(Access::Read, "a", "")),
            Err(AuthError::PermissionDenied)
        );
    }

    #[test]
    fn a_single_key_permission_is_the_range_up_to_its_successor() {
        // Point `a` and range [a\0, c) together cover [a, c); point `a`
        // alone covers [a, a\0) but not [a, a\0\0) or [a, b).
        let s = store_with(&[
            grant("r", PermType::Read, "a", ""),
            grant("r", PermType::Read, "a\0", "c"),
            grant("r", PermType::Write, "k", ""),
        ]);
        let alice = Some("alice");
        assert_eq!(s.check(alice, &need(Access::Read, "a", "c")), Ok(()));
        assert_eq!(s.check(alice, &need(Access::Read, "a", "b")), Ok(()));
        assert_eq!(
            s.check(alice, &need(Access::Read, "a", "d")),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(s.check(alice, &need(Access::Write, "k", "k\0")), Ok(()));
        assert_eq!(s.check(alice, &need(Access::Write, "k", "")), Ok(()));
        assert_eq!(
            s.check(alice, &need(Access::Write, "k", "k\0\0")),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(
            s.check(alice, &need(Access::Write, "k", "l")),
            Err(AuthError::PermissionDenied)
        );
        // An empty or inverted range needs nothing.
        assert_eq!(s.check(alice, &need(Access::Write, "z", "b")), Ok(()));
    }

    fn login(s: &mut AuthStore, user: &str, prefix: &str, index: u64, now: Instant) -> String {
        let req = AuthRequest::Authenticate {
            name: user.into(),
            token_prefix: prefix.into(),
        };
        match s.apply(&req, index, now).unwrap().0 {
            AuthApplied::Token(t) => t,
            other => panic!("login answered {other:?}"),
        }
    }

    #[test]
    fn jwt_logins_are_signed_for_the_auth_revision_and_go_stale_for_key_checks() {
        let keys = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");
        let option = format!("jwt,pub-key={keys}/ec.pub,priv-key={keys}/ec.key,sign-method=ES256");
        let mut s = store_with(&[]);
        s.set_token_settings(TokenSettings {
            kind: crate::jwt::TokenKind::from_option(&option).unwrap(),
            simple_ttl: TOKEN_TTL,
        });
        let now = Instant::now();
        let token = login(&mut s, "alice", "unused", 10, now);
        assert_eq!(token.split('.').count(), 3, "a JWS: {token}");
        assert!(s.tokens.is_empty(), "nothing kept per token");
        assert_eq!(s.user_of(Some(&token), now, true), Ok(Some("alice".into())));
        // Any auth change: key checks refuse the older token, as etcd's
        // isOpPermitted; admin and permission-free requests take it.
        applied(&mut s, AuthRequest::RoleAdd { name: "r2".into() }).unwrap();
        assert_eq!(
            s.user_of(Some(&token), now, true),
            Err(AuthError::AuthOldRevision)
        );
        assert_eq!(
            s.user_of(Some(&token), now, false),
            Ok(Some("alice".into()))
        );
        let fresh = login(&mut s, "alice", "unused", 11, now);
        assert_eq!(s.user_of(Some(&fresh), now, true), Ok(Some("alice".into())));
        assert_eq!(
            s.user_of(Some("a.b.c"), now, false),
            Err(AuthError::InvalidAuthToken)
        );
        // A snapshot install keeps the member's token settings.
        let mut after = store_with(&[]);
        after.adopt_tokens(s);
        let token = login(&mut after, "alice", "unused", 12, now);
        assert_eq!(token.split('.').count(), 3);
        // A member without the private key issues none.
        let verify_only = format!("jwt,pub-key={keys}/ec.pub,sign-method=ES256");
        after.set_token_settings(TokenSettings {
            kind: crate::jwt::TokenKind::from_option(&verify_only).unwrap(),
            simple_ttl: TOKEN_TTL,
        });
        let req = AuthRequest::Authenticate {
            name: "alice".into(),
            token_prefix: "x".into(),
        };
        assert_eq!(
            after.apply(&req, 13, now).err(),
            Some(AuthError::TokenSigning(crate::jwt::SignError::VerifyOnly))
        );
    }

    #[test]
    fn idle_tokens_are_swept_by_the_next_login() {
        let mut s = store_with(&[]);
        let start = Instant::now();
        let old = login(&mut s, "alice", "old", 10, start);
        assert_eq!(s.tokens.len(), 1);
        let later = start + TOKEN_TTL + Duration::from_secs(1);
        let new = login(&mut s, "alice", "new", 11, later);
        assert_eq!(
            s.tokens.len(),
            1,
            "the idle token is gone without being shown"
        );
        assert_eq!(
            s.user_of(Some(&old), later, true),
            Err(AuthError::InvalidAuthToken)
        );
        assert_eq!(s.user_of(Some(&new), later, true), Ok(Some("alice".into())));
    }

    #[test]
    fn a_snapshot_install_keeps_the_tokens_of_users_that_remain() {
        let now = Instant::now();
        let mut before = store_with(&[]);
        let alice = login(&mut before, "alice", "a", 10, now);
        let root = login(&mut before, "root", "r", 11, now);
        // The snapshot's state: alice deleted.
        let mut after = store_with(&[]);
        applied(
            &mut after,
            AuthRequest::UserDelete {
                name: "alice".into(),
            },
        )
        .unwrap();
        after.adopt_tokens(before);
        assert_eq!(
            after.user_of(Some(&root), now, true),
            Ok(Some("root".into()))
        );
        assert_eq!(
            after.user_of(Some(&alice), now, true),
            Err(AuthError::InvalidAuthToken)
        );

        // A password change inside the snapshot ends the user's logins.
        let mut before = store_with(&[]);
        let root = login(&mut before, "root", "r", 11, now);
        let mut after = store_with(&[]);
        applied(
            &mut after,
            AuthRequest::UserChangePassword {
                name: "root".into(),
                hashed_password: b("other"),
            },
        )
        .unwrap();
        after.adopt_tokens(before);
        assert_eq!(
            after.user_of(Some(&root), now, true),
            Err(AuthError::InvalidAuthToken)
        );
    }

    #[test]
    fn root_stays_while_auth_is_on_and_tokens_die_with_their_user() {
        let mut s = store_with(&[]);
        let now = Instant::now();
        let (token, _) = s
            .apply(
                &AuthRequest::Authenticate {
                    name: "alice".into(),
                    token_prefix: "abc".into(),
                },
                42,
                now,
            )
            .unwrap();
        let AuthApplied::Token(token) = token else {
            panic!("no token")
        };
        assert_eq!(token, "abc.42");
        assert_eq!(s.user_of(Some(&token), now, true), Ok(Some("alice".into())));
        assert_eq!(
            s.user_of(Some("nope.1"), now, true),
            Err(AuthError::InvalidAuthToken)
        );
        assert_eq!(
            s.user_of(Some(&token), now + TOKEN_TTL + TOKEN_TTL, true),
            Err(AuthError::InvalidAuthToken)
        );
        for req in [
            AuthRequest::UserDelete {
                name: "root".into(),
            },
            AuthRequest::RoleDelete { role: ROOT.into() },
            AuthRequest::UserRevokeRole {
                name: "root".into(),
                role: ROOT.into(),
            },
        ] {
            assert_eq!(applied(&mut s, req), Err(AuthError::InvalidAuthMgmt));
        }
        let (t2, _) = s
            .apply(
                &AuthRequest::Authenticate {
                    name: "alice".into(),
                    token_prefix: "def".into(),
                },
                43,
                now,
            )
            .unwrap();
        let AuthApplied::Token(t2) = t2 else { panic!() };
        applied(
            &mut s,
            AuthRequest::UserDelete {
                name: "alice".into(),
            },
        )
        .unwrap();
        assert_eq!(
            s.user_of(Some(&t2), now, true),
            Err(AuthError::InvalidAuthToken)
        );
    }

    #[test]
    fn restore_gives_back_the_applied_state() {
        let mut s = AuthStore::default();
        let mut records: BTreeMap<Vec<u8>, Bytes> = BTreeMap::new();
        let reqs = [
            AuthRequest::UserAdd {
                name: "root".into(),
                hashed_password: b("$2a$10$x"),
                no_password: false,
            },
            AuthRequest::UserAdd {
                name: "bob".into(),
                hashed_password: Bytes::new(),
                no_password: true,
            },
            AuthRequest::RoleAdd { name: "r".into() },
            grant("r", PermType::ReadWrite, "k", "l"),
            grant("r", PermType::Read, "a", ""),
            AuthRequest::UserGrantRole {
                user: "root".into(),
                role: ROOT.into(),
            },
            AuthRequest::UserGrantRole {
                user: "bob".into(),
                role: "r".into(),
            },
            AuthRequest::Enable,
        ];
        for (i, req) in reqs.iter().enumerate() {
            let mut encoded = Vec::new();
            encode(req, &mut encoded);
            assert_eq!(decode(&Bytes::from(encoded)).as_ref(), Some(req));
            let (_, changes) = s.apply(req, i as u64 + 1, Instant::now()).unwrap();
            for (k, v) in changes {
                match v {
                    Some(v) => records.insert(k, v),
                    None => records.remove(&k),
                };
            }
        }
        let list: Vec<(Bytes, Bytes)> = records
            .into_iter()
            .map(|(k, v)| (Bytes::from(k), v))
            .collect();
        let r = AuthStore::restore(&list).unwrap();
        assert!(r.enabled());
        assert_eq!(r.revision(), s.revision());
        assert_eq!(r.users, s.users);
        assert_eq!(r.roles, s.roles);
        assert_eq!(
            r.role("r")
                .unwrap()
                .perms
                .iter()
                .map(|p| &p.key[..])
                .collect::<Vec<_>>(),
            vec![&b"a"[..], b"k"]
        );
        assert_eq!(r.password_hash("bob"), Err(AuthError::AuthFailed));
    }
}
