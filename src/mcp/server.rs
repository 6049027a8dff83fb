//! The MCP server of one session: lists the tools of [`super::catalog`] and runs their calls
//! against the session's [`Branches`]. A tool that fails answers with a tool error (text the
//! model reads and can act on), never a protocol error.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, Implementation, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value};
use shade_agent::tools::{Tool, ToolError};
use shade_agent::ToolContext;
use shade_classify as shell_classify;
use shade_fusefs::accept::history;
use shade_fusefs::outside::OutsideChanges;
use shade_fusefs::quote::quote_path;
use shade_fusefs::undo::{self, UndoError, UndoOptions};
use shade_fusefs::{AcceptError, AcceptFlags, Change};
use tokio_util::sync::CancellationToken;

use super::branches::Branches;
use super::catalog::{self, Action};

/// Agent tools that run in shade's own process (all but `run_command` and `diagnostics`,
/// whose commands run sandboxed under their own limits) in flight at once, over every session of the process.
/// Each call is bounded in what it reads and holds; this bounds how many there are, since a
/// client may send any number at once (8 parallel reads of a file of empty lines once took
/// shade to 2.5 GiB). A call past it waits its turn (and may be cancelled meanwhile).
pub const IN_PROCESS_TOOLS_MAX: usize = 4;

static IN_PROCESS_TOOLS: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(IN_PROCESS_TOOLS_MAX);

/// The handler of one MCP session (one client).
#[derive(Clone)]
pub struct ShadeServer {
    branches: Arc<Branches>,
    tools: Arc<Vec<catalog::Entry>>,
}

/// A tool's successful answer: text for the model and, for a tool with an output schema,
/// the same as `structuredContent` (branch ids, changes, exit codes), so a client need not
/// parse prose.
struct Reply {
    text: String,
    structured: Option<Value>,
}

impl From<String> for Reply {
    fn from(text: String) -> Reply {
        Reply {
            text,
            structured: None,
        }
    }
}

impl Reply {
    fn with(text: String, structured: Value) -> Reply {
        Reply {
            text,
            structured: Some(structured),
        }
    }
}

/// A tool's answer: `Err` is the text of a tool error.
type Answer = Result<Reply, String>;

impl ShadeServer {
    /// A server whose branches live in `branches`; commands are limited to `time_limit_secs`.
    pub fn new(branches: Arc<Branches>, time_limit_secs: u64) -> ShadeServer {
        ShadeServer {
            branches,
            tools: Arc::new(catalog::all(time_limit_secs)),
        }
    }

    /// Runs one call; `Err` is the text of a tool error.
    async fn dispatch(
        &self,
        action: Action,
        mut args: Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Answer {
        match action {
            Action::Create => self.create().await,
            Action::List => Ok(self.list()),
            Action::Compare => {
                let id = take_branch(&mut args)?;
                let other = match args.remove("other") {
                    Some(Value::String(o)) => o,
                    _ => return Err("invalid arguments: `other` (a branch id) is required".into()),
                };
                self.compare(&id, &other).await
            }
            Action::CheckCommand => self.check_command(&args),
            Action::Agent(tool) => {
                let id = take_branch(&mut args)?;
                self.agent_tool(&id, tool, args, &context.ct).await
            }
            Action::Changes => self.changes(&take_branch(&mut args)?).await,
            Action::Diff => self.diff(&take_branch(&mut args)?).await,
            Action::Accept => self.accept(&take_branch(&mut args)?, context).await,
            Action::Abort => self.abort(&take_branch(&mut args)?).await,
            Action::Undo => self.undo(&args, context).await,
        }
    }

    async fn create(&self) -> Answer {
        let branches = self.branches.clone();
        let id = blocking(move || branches.create().map_err(|e| format!("{e:#}"))).await?;
        let project = self.branches.project().display().to_string();
        Ok(Reply::with(
            format!(
                "Created branch {id} of {project}. Pass \"branch\": \"{id}\" to the file and \
                 command tools; nothing reaches the project until accept_branch."
            ),
            serde_json::json!({"branch": id, "project": project}),
        ))
    }

    fn list(&self) -> Reply {
        let ids = self.branches.ids();
        let counts: Vec<(String, usize)> = ids
            .iter()
            .map(|id| {
                let n = self
                    .branches
                    .get(id)
                    .ok()
                    .and_then(|e| {
                        e.shadow()
                            .as_ref()
                            .map(|s| s.changeset(false).changes.len())
                    })
                    .unwrap_or(0);
                (id.clone(), n)
            })
            .collect();
        let structured = serde_json::json!({"branches": counts
            .iter()
            .map(|(id, n)| serde_json::json!({"branch": id, "changed": n}))
            .collect::<Vec<_>>()});
        if ids.is_empty() {
            return Reply::with(
                "No live branches; create_branch makes one.".into(),
                structured,
            );
        }
        let text = counts
            .iter()
            .map(|(id, n)| format!("{id}: {n} changed path{}", plural(*n)))
            .collect::<Vec<_>>()
            .join("\n");
        Reply::with(text, structured)
    }

    /// Two branches side by side: each one's changes and diff size, and the diff from the
    /// first's version of every path either changed to the second's.
    async fn compare(&self, id: &str, other: &str) -> Answer {
        if id == other {
            return Err("compare_branches needs two different branches".into());
        }
        let (a, b) = (self.branches.get(id)?, self.branches.get(other)?);
        let (id, other) = (id.to_string(), other.to_string());
        blocking(move || {
            // Both read through their mounts: attached for the comparison, then let go.
            let _held = (a.hold()?, b.hold()?);
            let (sa, sb) = (a.shadow(), b.shadow());
            let (Some(sa), Some(sb)) = (sa.as_ref(), sb.as_ref()) else {
                return Err("a branch is being accepted or aborted".to_string());
            };
            let (ca, cb) = (sa.changeset(false), sb.changeset(false));
            let size = |s: &shade_agent::Shadow, c: &shade_fusefs::Changeset| {
                crate::attempts::diff_lines(&s.diff(c))
            };
            let (na, nb) = (size(sa, &ca), size(sb, &cb));
            let diff = crate::attempts::diff_between(
                (&id, &sa.mountpoint(), &ca.changes),
                (&other, &sb.mountpoint(), &cb.changes),
            );
            let text = format!(
                "{id}: {} changed path{}, {na} diff lines\n{other}: {} changed path{}, {nb} diff lines\n{}",
                ca.changes.len(),
                plural(ca.changes.len()),
                cb.changes.len(),
                plural(cb.changes.len()),
                if diff.is_empty() {
                    format!("{id} and {other} hold the same version of every changed path.")
                } else {
                    format!("Diff from {id} to {other}:\n{diff}")
                }
            );
            let structured = serde_json::json!({
                "branches": [
                    {"branch": id, "changes": ca.changes, "diff_lines": na},
                    {"branch": other, "changes": cb.changes, "diff_lines": nb},
                ],
                "same": diff.is_empty(),
                "diff": diff,
            });
            Ok(Reply::with(text, structured))
        })
        .await
    }

    fn check_command(&self, args: &Map<String, Value>) -> Answer {
        let command = args
            .get("command")
            .and_then(Value::as_str)
            .ok_or("invalid arguments: `command` (a string) is required")?;
        let verdict = shell_classify::classify_in(command, self.branches.project());
        let structured = serde_json::to_value(&verdict).map_err(|e| e.to_string())?;
        Ok(Reply::with(structured.to_string(), structured))
    }

    /// One of the agent's tools, in branch `id`: arguments repaired as the agent's loop
    /// does ([`Tool::prepare`]), then run.
    async fn agent_tool(
        &self,
        id: &str,
        tool: Arc<dyn Tool>,
        args: Map<String, Value>,
        cancel: &CancellationToken,
    ) -> Answer {
        let entry = self.branches.get(id)?;
        let frozen = || {
            format!(
                "branch {id} is being accepted: it takes no more calls (its commands were \
                 stopped so that what the user confirms is what is written)"
            )
        };
        if entry.frozen() {
            return Err(frozen());
        }
        // Taken before the branch's lock, so a call waiting for its turn holds up no accept.
        let _turn = match tool.name() {
            "shell" | "diagnostics" => None,
            _ => tokio::select! {
                permit = IN_PROCESS_TOOLS.acquire() => permit.ok(),
                () = cancel.cancelled() => return Err("cancelled".into()),
            },
        };
        let _busy = entry.busy.read().await;
        if entry.frozen() {
            return Err(frozen());
        }
        // The branch is mounted for the call, and let go (detached) after it.
        let e = entry.clone();
        let held = blocking(move || e.hold()).await?;
        let answer = Self::run_tool(id, tool, args, &held.ctx, cancel).await;
        release(held).await;
        answer
    }

    /// One agent tool's call with `ctx` (the branch held attached by the caller).
    async fn run_tool(
        id: &str,
        tool: Arc<dyn Tool>,
        args: Map<String, Value>,
        ctx: &ToolContext,
        cancel: &CancellationToken,
    ) -> Answer {
        if tool.name() == "diagnostics" && ctx.lint.is_none() {
            return Err(
                "No lints in this session: shade mcp was started with --no-lint, or shade \
                        found no checker for the project (set `[lint] command` in shade's config \
                        file). Run the project's checker with run_command instead."
                    .into(),
            );
        }
        let prepared = tool.prepare(Value::Object(args), ctx, cancel).await;
        let out = tool
            .run(prepared.args, ctx, cancel)
            .await
            .map_err(|e| tool_error(&e))?;
        let text = match prepared.note {
            Some(note) => format!("{}\n{note}", out.content),
            None => out.content,
        };
        if tool.name() != "shell" {
            return Ok(text.into());
        }
        // run_command: its exit code as the shell tool states it.
        let exit_code = text
            .lines()
            .find_map(|l| l.strip_prefix("Exit code: "))
            .and_then(|c| c.trim().parse::<i64>().ok());
        let structured = serde_json::json!({"branch": id, "exit_code": exit_code, "output": text});
        Ok(Reply::with(text, structured))
    }

    /// The branch's changeset (ignored paths left out, as accept does).
    async fn changeset(&self, id: &str) -> Result<Vec<Change>, String> {
        let entry = self.branches.get(id)?;
        blocking(move || match entry.shadow().as_ref() {
            Some(s) => Ok(s.changeset(false).changes),
            None => Err("the branch is being accepted or aborted".to_string()),
        })
        .await
    }

    /// What the branch's commands wrote outside the project.
    async fn outside(&self, id: &str) -> Result<OutsideChanges, String> {
        let entry = self.branches.get(id)?;
        blocking(move || match entry.shadow().as_ref() {
            Some(s) => Ok(s.outside()),
            None => Err("the branch is being accepted or aborted".to_string()),
        })
        .await
    }

    async fn changes(&self, id: &str) -> Answer {
        let changes = self.changeset(id).await?;
        let outside = self.outside(id).await?;
        let structured = serde_json::json!({
            "branch": id,
            "changes": changes,
            "outside": outside.lines(shade_fusefs::outside::home_dir().as_deref()),
        });
        if changes.is_empty() && outside.is_empty() {
            return Ok(Reply::with(
                format!("Branch {id} has no changes."),
                structured,
            ));
        }
        let mut text = lines(&changes);
        if !outside.is_empty() {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&outside_block(&outside));
        }
        Ok(Reply::with(text, structured))
    }

    async fn diff(&self, id: &str) -> Answer {
        let entry = self.branches.get(id)?;
        let mut text = blocking(move || match entry.shadow().as_ref() {
            Some(s) => Ok(s.diff(&s.changeset(false))),
            None => Err("the branch is being accepted or aborted".to_string()),
        })
        .await?;
        text.push_str(&crate::outside::diff(&self.outside(id).await?));
        let structured = serde_json::json!({"branch": id, "diff": text});
        if text.is_empty() {
            return Ok(Reply::with(
                format!("Branch {id} has no changes."),
                structured,
            ));
        }
        Ok(Reply::with(text, structured))
    }

    /// Accept: the branch is frozen first (its commands killed, other calls on it refused),
    /// then listed, refused on conflicts (branch kept), confirmed by the user where the
    /// client can ask, and exactly what was listed written atomically and the branch closed.
    async fn accept(&self, id: &str, context: &RequestContext<RoleServer>) -> Answer {
        let entry = self.branches.get(id)?;
        if entry.frozen() {
            return Err(format!("branch {id} is already being accepted"));
        }
        entry.set_frozen(true);
        let frozen = freeze(&entry).await;
        let answer = match frozen {
            Ok(_guard) => {
                // Listing reads through the mount: attached until the accept is done (or
                // declined, when the branch is let go again).
                let e = entry.clone();
                match blocking(move || e.hold()).await {
                    Ok(held) => {
                        let answer = self.accept_frozen(id, &entry, context).await;
                        release(held).await;
                        answer
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        // Still live (declined, refused on conflicts): it takes calls again.
        entry.set_frozen(false);
        answer
    }

    /// [`ShadeServer::accept`] once nothing can write in the branch any more.
    async fn accept_frozen(
        &self,
        id: &str,
        entry: &Arc<super::branches::Entry>,
        context: &RequestContext<RoleServer>,
    ) -> Answer {
        let listed = entry.clone();
        let (changes, outside, listed_state, listing) =
            blocking(move || match listed.shadow().as_ref() {
                Some(s) => {
                    let changes = s.changeset(false).changes;
                    let state = BranchState::of(&s.mountpoint(), &changes);
                    let listing = lines_with_links(&changes, &s.mountpoint());
                    Ok((changes, s.outside(), state, listing))
                }
                None => Err("the branch is being accepted or aborted".to_string()),
            })
            .await?;
        let dropped = if outside.is_empty() {
            String::new()
        } else {
            format!(
                "\nNot written: {} (accept writes the project only; they are dropped with the \
                 branch).",
                crate::outside::summary(&outside, 10).unwrap_or_default()
            )
        };
        let check = entry.clone();
        let listed = changes.clone();
        blocking(move || match check.shadow().as_ref() {
            Some(s) => {
                s.check_accept(AcceptFlags::default())
                    .map_err(|e| refusal(&e, "Nothing was written and the branch is kept"))?;
                // Red team round 8: the model's own accept never writes code for the host
                // (the project is or holds the home): only the user does.
                host_code_refusal(
                    &s.host_code_changes(&shade_fusefs::Changeset { changes: listed }),
                )
            }
            None => Err("the branch is being accepted or aborted".to_string()),
        })
        .await?;
        if !changes.is_empty() {
            confirm(id, &self.branches, &changes, &listing, context).await?;
        }
        let entry = self.branches.remove(id).unwrap_or_else(|| entry.clone());
        let Some(shadow) = entry.shadow().take() else {
            return Err("the branch is being accepted or aborted".into());
        };
        let project = self.branches.project().display().to_string();
        let origin = self.branches.origin(&client_name(context));
        let note = origin.clone();
        let confirmed = changes.clone();
        let report = blocking(move || {
            // What was listed (and confirmed) is exactly what is written, or nothing is.
            let now = shadow.changeset(false).changes;
            if now != confirmed || BranchState::of(&shadow.mountpoint(), &now) != listed_state {
                let differs = differing(&confirmed, &now);
                shadow.abort();
                return Err(format!(
                    "Not accepted: the branch changed after its changes were listed{}{differs}. \
                     Nothing was written; the branch is closed.",
                    if confirmed.is_empty() {
                        ""
                    } else {
                        " for confirmation"
                    }
                ));
            }
            history::with_note(note, None, || shadow.accept(AcceptFlags::default()))
                .map_err(|e| refusal(&e, "Nothing was written; the branch is closed"))
        })
        .await?;
        let structured = serde_json::json!({"branch": id, "accepted": true, "changes": changes});
        let recorded = self
            .own_accepts(&origin)
            .last()
            .map(|e| {
                self.branches.record_own(&e.id);
                format!(
                    "\nRecorded as accept {} (undo_accept takes it back while nobody changed \
                     those paths since).",
                    e.id
                )
            })
            .unwrap_or_default();
        if changes.is_empty() {
            return Ok(Reply::with(
                format!("Branch {id} had no changes; it is closed.{dropped}"),
                structured,
            ));
        }
        let note = report
            .privileges_note()
            .map(|n| format!("\nNote: {n}."))
            .unwrap_or_default()
            + &dropped
            + &recorded;
        Ok(Reply::with(
            format!(
                "Accepted branch {id} into {project}: {} change{} written; the branch is closed.\n{}{note}",
                changes.len(),
                plural(changes.len()),
                lines(&changes)
            ),
            structured,
        ))
    }

    /// This session's accepts in the project's history (those recorded with `origin`),
    /// oldest first.
    fn own_accepts(&self, origin: &str) -> Vec<history::Entry> {
        undo::project_history(self.branches.state(), self.branches.project())
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.origin == origin)
            .collect()
    }

    /// `undo_accept`: the accept named by `id`, else this session's newest not undone.
    async fn undo(
        &self,
        args: &Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Answer {
        let keep_mine = match args.get("keep_mine") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("invalid arguments: `keep_mine` is true or false".into()),
        };
        let origin = self.branches.origin(&client_name(context));
        let all = undo::project_history(self.branches.state(), self.branches.project())
            .map_err(|e| e.to_string())?;
        let id = match args.get("id") {
            Some(Value::String(id)) => id.clone(),
            None | Some(Value::Null) => {
                let own = self.branches.own_ids();
                all.iter()
                    .rev()
                    .find(|e| {
                        own.contains(&e.id)
                            && e.undoes.is_none()
                            && history::undone_by(&all, &e.id).is_none()
                    })
                    .map(|e| e.id.clone())
                    .ok_or(
                        "Nothing to undo: this session has no accept that is not undone \
                            (pass `id` to undo another one; the user is asked to confirm it).",
                    )?
            }
            Some(_) => return Err("invalid arguments: `id` is an accept id (a string)".into()),
        };
        if !self.branches.is_own(&id) {
            // Not this session's: the user's own accept, another client's. Only the user
            // may let it be undone.
            let Some(entry) = all.iter().find(|e| e.id == id) else {
                return Err(format!(
                    "Not undone: no accept `{}` in this project's history.",
                    shade_fusefs::quote::visible_line(&id)
                ));
            };
            confirm_foreign(entry, self.branches.project(), context).await?;
        }
        let state = self.branches.state().clone();
        let project = self.branches.project().to_path_buf();
        let opts = UndoOptions {
            keep_mine,
            dry_run: false,
            origin: format!("{origin}: undo_accept {id}"),
        };
        let report = blocking(move || {
            undo::undo(&state, &project, Some(&id), &opts).map_err(|e| match e {
                UndoError::Conflicts { id, kept } => {
                    let mut s = format!(
                        "Not undone: {} path{} changed since accept {id}; nothing was written \
                         (keep_mine: true leaves them as they are and undoes the rest).",
                        kept.len(),
                        plural(kept.len())
                    );
                    for k in kept {
                        s.push_str(&format!("\n  {}: {}", quote_path(&k.path), k.reason));
                    }
                    s
                }
                other => format!("Not undone: {other}"),
            })
        })
        .await?;
        if let Some(u) = &report.undo_id {
            self.branches.record_own(u);
        }
        let mut text = format!(
            "Undid accept {} in {}:",
            report.id,
            self.branches.project().display()
        );
        for p in &report.restored {
            text.push_str(&format!("\n  restored {}", quote_path(p)));
        }
        for p in &report.removed {
            text.push_str(&format!("\n  removed {}", quote_path(p)));
        }
        for k in &report.kept {
            text.push_str(&format!(
                "\n  kept as it is: {}: {}",
                quote_path(&k.path),
                k.reason
            ));
        }
        if let Some(u) = &report.undo_id {
            text.push_str(&format!(
                "\nRecorded as accept {u}: undo_accept with that id puts the changes back."
            ));
        }
        let shown = |l: &[std::path::PathBuf]| -> Vec<String> {
            l.iter().map(|p| p.to_string_lossy().into_owned()).collect()
        };
        let kept: Vec<Value> = report
            .kept
            .iter()
            .map(|k| serde_json::json!({"path": k.path.to_string_lossy(), "reason": k.reason}))
            .collect();
        let structured = serde_json::json!({
            "id": report.id,
            "restored": shown(&report.restored),
            "removed": shown(&report.removed),
            "kept": kept,
            "undo_id": report.undo_id,
        });
        Ok(Reply::with(text, structured))
    }

    async fn abort(&self, id: &str) -> Answer {
        let entry = self.branches.get(id)?;
        self.branches.remove(id);
        let shadow = entry.shadow().take();
        blocking(move || {
            if let Some(s) = shadow {
                s.abort();
            }
            Ok(())
        })
        .await?;
        Ok(Reply::with(
            format!("Branch {id} aborted: its changes are dropped and the project is unchanged."),
            serde_json::json!({"branch": id, "aborted": true}),
        ))
    }
}

/// Freezes a branch for an accept: kills its running commands until every tool call in it
/// has returned, then holds it exclusively (with `frozen` set, new calls are refused and
/// calls waiting for it give up), so nothing writes in it until the guard is dropped.
async fn freeze(
    entry: &Arc<super::branches::Entry>,
) -> Result<tokio::sync::RwLockWriteGuard<'_, ()>, String> {
    loop {
        let e = entry.clone();
        blocking(move || {
            if let Some(s) = e.shadow().as_ref() {
                s.kill_commands();
            }
            Ok(())
        })
        .await?;
        // A run_command call that was starting its command when the first kill came is
        // killed by the next round.
        if let Ok(g) =
            tokio::time::timeout(std::time::Duration::from_secs(1), entry.busy.write()).await
        {
            return Ok(g);
        }
    }
}

/// Keys of the content fingerprints (random per process: a command cannot aim for a
/// collision).
static FINGERPRINT_KEYS: std::sync::LazyLock<std::collections::hash_map::RandomState> =
    std::sync::LazyLock::new(std::collections::hash_map::RandomState::new);

/// What each changed path of a branch holds, as the user was shown it: type, mode, size
/// and a keyed hash of the content (a symlink's target). An accept writes only if the
/// branch still holds exactly this.
#[derive(Debug, PartialEq, Eq)]
struct BranchState(Vec<(std::path::PathBuf, Option<Print>)>);

/// One path's mode, size and keyed content hash.
type Print = (u32, u64, u64);

impl BranchState {
    /// The state of `changes`' paths in the branch mounted at `mount`.
    fn of(mount: &std::path::Path, changes: &[Change]) -> BranchState {
        BranchState(
            changes
                .iter()
                .map(|c| (c.path.clone(), fingerprint(&mount.join(&c.path))))
                .collect(),
        )
    }
}

/// Mode, size and keyed content hash of `path`, never following a symlink (`None`: gone).
fn fingerprint(path: &std::path::Path) -> Option<Print> {
    use std::hash::{BuildHasher, Hasher};
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let meta = std::fs::symlink_metadata(path).ok()?;
    let mut h = FINGERPRINT_KEYS.build_hasher();
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(path).ok()?;
        h.write(std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str()));
    } else if meta.is_file() {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .ok()?;
        let opened = f.metadata().ok()?;
        if !opened.is_file() || opened.ino() != meta.ino() {
            return Some((u32::MAX, 0, 0)); // swapped: never equal to a listed state
        }
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => h.write(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Some((u32::MAX, 0, 1)),
            }
        }
    }
    Some((meta.mode(), meta.len(), h.finish()))
}

/// Which paths differ between what was `listed` and the branch `now` (up to ten named).
fn differing(listed: &[Change], now: &[Change]) -> String {
    let added: Vec<String> = now
        .iter()
        .filter(|c| !listed.contains(c))
        .map(|c| c.to_string())
        .collect();
    let gone: Vec<String> = listed
        .iter()
        .filter(|c| !now.contains(c))
        .map(|c| c.to_string())
        .collect();
    if added.is_empty() && gone.is_empty() {
        return " (the contents of a listed path changed)".into();
    }
    let mut s = String::from(":");
    for (what, l) in [("not listed", &added), ("listed but no longer so", &gone)] {
        if !l.is_empty() {
            let more = l.len().saturating_sub(10);
            s.push_str(&format!("\n  {what}: {}", l[..l.len().min(10)].join(", ")));
            if more > 0 {
                s.push_str(&format!(" and {more} more"));
            }
        }
    }
    s.push('\n');
    s
}

/// The MCP client's name as it introduced itself (for the history's origin).
fn client_name(context: &RequestContext<RoleServer>) -> String {
    context
        .peer
        .peer_info()
        .map(|i| i.client_info.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "unnamed".into())
}

/// Asks the user to confirm accepting branch `id` when the client declared elicitation;
/// otherwise the client's own approval of the `accept_branch` call is the confirmation.
async fn confirm(
    id: &str,
    branches: &Branches,
    changes: &[Change],
    listing: &str,
    context: &RequestContext<RoleServer>,
) -> Result<(), String> {
    let asks = context
        .client_capabilities()
        .is_some_and(|c| c.elicitation.is_some());
    if !asks {
        return Ok(());
    }
    let message = format!(
        "Write branch {id} into {}? {} change{}:\n{}",
        branches.project().display(),
        changes.len(),
        plural(changes.len()),
        listing
    );
    let schema: ElicitationSchema =
        serde_json::from_value(serde_json::json!({"type": "object", "properties": {}}))
            .map_err(|e| e.to_string())?;
    let request = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    };
    match context.peer.create_elicitation(request).await {
        Ok(r) if r.action == ElicitationAction::Accept => Ok(()),
        Ok(r) => Err(format!(
            "Not accepted: the user {} the confirmation. Nothing was written and branch {id} \
             is kept.",
            if r.action == ElicitationAction::Decline {
                "declined"
            } else {
                "cancelled"
            }
        )),
        Err(e) => Err(format!(
            "Not accepted: the confirmation could not be asked ({e}). Nothing was written and \
             branch {id} is kept."
        )),
    }
}

/// Asks the user whether accept `entry`, which this session did not make, may be undone;
/// refused where the client cannot ask.
async fn confirm_foreign(
    entry: &history::Entry,
    project: &std::path::Path,
    context: &RequestContext<RoleServer>,
) -> Result<(), String> {
    let origin = shade_fusefs::quote::visible_line(&entry.origin).into_owned();
    let asks = context
        .client_capabilities()
        .is_some_and(|c| c.elicitation.is_some());
    if !asks {
        return Err(format!(
            "Not undone: accept {} was not made by this session (it came from {origin}); only \
             the user may undo it (shade undo {}), and this client cannot ask them.",
            entry.id, entry.id
        ));
    }
    let message = format!(
        "Undo accept {} in {}? This session did not make it: it came from {origin}, and \
         changed {} path{}. Undoing puts them back as they were before it.",
        entry.id,
        project.display(),
        entry.paths,
        plural(entry.paths)
    );
    let schema: ElicitationSchema =
        serde_json::from_value(serde_json::json!({"type": "object", "properties": {}}))
            .map_err(|e| e.to_string())?;
    let request = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    };
    match context.peer.create_elicitation(request).await {
        Ok(r) if r.action == ElicitationAction::Accept => Ok(()),
        Ok(_) => Err(format!(
            "Not undone: the user did not confirm undoing accept {} (not made by this \
             session). Nothing was written.",
            entry.id
        )),
        Err(e) => Err(format!(
            "Not undone: the confirmation could not be asked ({e}). Nothing was written."
        )),
    }
}

/// Why an accept was refused, naming every conflicting path.
fn refusal(e: &AcceptError, outcome: &str) -> String {
    match e {
        AcceptError::Conflicts(list) => {
            let mut s = format!(
                "Not accepted: {} path{} changed in the project since the branch read {}. {outcome}.",
                list.len(),
                plural(list.len()),
                if list.len() == 1 { "it" } else { "them" }
            );
            for c in list {
                s.push_str(&format!("\n  {c}"));
            }
            s
        }
        other => format!("Not accepted: {other}. {outcome}."),
    }
}

fn take_branch(args: &mut Map<String, Value>) -> Result<String, String> {
    match args.remove("branch") {
        Some(Value::String(id)) => Ok(id),
        _ => Err("invalid arguments: `branch` (the id create_branch returned) is required".into()),
    }
}

fn tool_error(e: &ToolError) -> String {
    format!("Error: {e}")
}

/// The outside changes, apart from the project's: a header, then one line each (many under
/// one directory grouped), paths with `~` for the home.
fn outside_block(outside: &OutsideChanges) -> String {
    let mut text = String::from("outside the project (not written by accept_branch):");
    for l in outside.lines(shade_fusefs::outside::home_dir().as_deref()) {
        text.push_str("\n  ");
        text.push_str(&l);
    }
    text
}

fn lines(changes: &[Change]) -> String {
    changes
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// [`lines`] with each symbolic link's target (`-> target`), read in the branch at
/// `mount` without following anything: the user confirms where a link points, not only
/// that a path changed (a link at `.git/logs/HEAD` makes git write anywhere).
fn lines_with_links(changes: &[Change], mount: &std::path::Path) -> String {
    let files = shade_fusefs::rootdir::RootDir::open(mount).ok();
    changes
        .iter()
        .map(|c| {
            let target = files
                .as_ref()
                .filter(|_| c.kind != shade_fusefs::ChangeKind::Deleted)
                .and_then(|f| f.read_link(&c.path).ok());
            match target {
                Some(t) => format!(
                    "{c} -> {}",
                    shade_fusefs::quote::quote_path(&t).into_owned()
                ),
                None => c.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Runs blocking branch work (mounts, changesets, accepts) off the async threads.
/// Let a call's hold on a branch go off the runtime's threads (detaching blocks).
async fn release(held: super::branches::Held) {
    let _ = blocking(move || {
        drop(held);
        Ok(())
    })
    .await;
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("shade's task failed: {e}"))?
}

impl ServerHandler for ShadeServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = InitializeResult::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("shade", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(format!(
            "shade gives you branches of the project {}: copy-on-write views of it in which you \
             read, write and edit files and run commands (builds, tests) sandboxed, without \
             touching the user's files. create_branch, work in it, look at list_changes/diff, then \
             accept_branch writes the changes into the project (conflict-checked, all or nothing) \
             or abort_branch drops them. Branches not accepted vanish when this session ends.",
            self.branches.project().display()
        ));
        info
    }

    /// Only revisions with a session (initialize): a branch lives as long as its session.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(
            self.tools.iter().map(|e| e.tool.clone()).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        self.tools
            .iter()
            .find(|e| e.tool.name == name)
            .map(|e| e.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(entry) = self.tools.iter().find(|e| e.tool.name == request.name) else {
            return Err(McpError::invalid_params(
                format!("unknown tool `{}`", request.name),
                None,
            ));
        };
        let args = request.arguments.unwrap_or_default();
        let answer = self.dispatch(entry.action.clone(), args, &context).await;
        Ok(match answer {
            Ok(reply) => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(reply.text)]);
                r.structured_content = reply.structured;
                r
            }
            Err(text) => CallToolResult::error(vec![ContentBlock::text(text)]),
        }
        .into())
    }
}

/// The refusal of an accept whose changes include code for the host (`held`, from
/// [`shade_agent::Shadow::host_code_changes`]); Ok when there is none.
fn host_code_refusal(held: &[std::path::PathBuf]) -> Result<(), String> {
    if held.is_empty() {
        return Ok(());
    }
    let paths: Vec<String> = held.iter().map(|p| quote_path(p).into_owned()).collect();
    Err(format!(
        "Not accepted: held for the user: {} code for the host by where it lies (a shell \
         start-up file, ~/.ssh, git's global config, shade's own config, autostart, a \
         directory on PATH, /etc…): {}. Only the user writes these, by hand. Nothing was \
         written and the branch is kept: abort it and redo the work in a new branch without \
         touching those paths (a change there stays one even when undone), and tell the user \
         what to change in them.",
        if held.len() == 1 {
            "this change is"
        } else {
            "these changes are"
        },
        paths.join(", ")
    ))
}
