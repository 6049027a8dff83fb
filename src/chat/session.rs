//! One chat session: the agent, the conversation it extends turn after turn, the model side,
//! and the bookkeeping that suggestions and compaction need.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use shade_agent::approval::{Approver, NoOneToAsk};
use shade_agent::compact::{compact, CompactError, CompactReport};
use shade_agent::followup::cache::new_session_id;
use shade_agent::followup::FollowupSettings;
use shade_llm::{LlmError, Message};

use shade_agent::sessions::{one_line, SavedSession, SessionStore};
use shade_agent::shadow::Live;
use shade_agent::{
    Agent, AgentError, AgentEvent, AgentOptions, EventSink, RunOutcome, Shadow, ShadowOptions,
    StopReason, ToolContext, ToolRegistry, Workspace,
};
use tokio_util::sync::CancellationToken;

use super::approve::ChatApprover;
use super::ChatArgs;
use crate::llm_setup::{self, LlmSetup};

/// Turns kept verbatim when older ones are summarised.
const KEEP_TURNS: usize = 2;

/// The session's state.
pub(crate) struct Session {
    pub agent: Agent,
    /// `--shadow`: the branch the agent works in (`/diff`, `/accept`, `/abort`).
    pub shadow: Option<Shadow>,
    /// The default (live) session: every tool call runs in a branch and is accepted into
    /// the project right after it (see `shade_agent::shadow::Live`); None with `--shadow`
    /// or `--unconfined`.
    pub live: Option<Arc<Live>>,
    /// The number of the turn running or last run (prompts and `!commands`), which names
    /// the session's accepts in the history.
    turn_no: usize,
    /// The conversation, system prompt first; empty before the first turn.
    pub conversation: Vec<Message>,
    pub llm: LlmSetup,
    /// Interactive approvals (None without a terminal).
    pub approver: Option<Arc<ChatApprover>>,
    /// Suggestions wanted (flag and setting).
    pub suggest: bool,
    /// Speculation wanted (flag and setting).
    pub speculate: bool,
    /// The config file's suggestion, cache-sharing, speculation and telemetry switches.
    pub settings: FollowupSettings,
    /// Did the last turn end with a model error?
    pub last_turn_failed: bool,
    /// Prompt tokens of the last model call: how full the context is.
    pub last_prompt_tokens: Arc<Mutex<u64>>,
    /// Identifies this session's saved prefixes (never used by another session).
    pub id: u64,
    pub runtime: tokio::runtime::Handle,
    /// The conversation as saved after each turn (`--continue`, `--resume`).
    saved: SavedSession,
    store: SessionStore,
    /// The `[mcp_servers]` whose tools the agent has; closed when the session ends.
    mcp: Option<shade_agent::tools::mcp::McpServers>,
}

/// Leaving closes the MCP servers (stdio ones see their input end).
impl Drop for Session {
    fn drop(&mut self) {
        let Some(mcp) = self.mcp.take() else { return };
        if tokio::runtime::Handle::try_current().is_err() {
            self.runtime.block_on(mcp.close());
        } else {
            self.runtime.spawn(mcp.close());
        }
    }
}

/// Where conversations are saved: `$SHADE_STATE_DIR/sessions`.
pub(crate) fn store() -> SessionStore {
    SessionStore::new(shade_fusefs::StateDir::from_env().root())
}

/// The project directory of `args`, as saved conversations name it.
pub(crate) fn project_dir(args: &ChatArgs) -> anyhow::Result<std::path::PathBuf> {
    let dir = args
        .directory
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("."));
    dir.canonicalize()
        .with_context(|| format!("cannot use {} as the project", dir.display()))
}

impl Session {
    pub fn new(
        args: &ChatArgs,
        interactive: bool,
        runtime: tokio::runtime::Handle,
    ) -> anyhow::Result<Session> {
        let dir = project_dir(args)?;
        let store = store();
        // Found before anything is set up, so a wrong id costs nothing.
        let resumed = match (&args.resume, args.continue_last) {
            (Some(id), _) => Some(store.find(&dir, id)?),
            (None, true) => Some(store.latest(&dir)?),
            (None, false) => None,
        };
        let workspace = Workspace::new(&dir)
            .with_context(|| format!("cannot use {} as the project", dir.display()))?;
        let llm = llm_setup::setup(&args.llm)?;
        let settings = llm.settings.followup;
        let approver = interactive.then(|| Arc::new(ChatApprover::default()));
        let approver_dyn: Arc<dyn Approver> = match &approver {
            Some(a) => a.clone(),
            None => Arc::new(NoOneToAsk {
                mode: args.approval,
            }),
        };
        // In a shadow session a speculation branches off the session's branch (it sees the
        // session's edits; accepting it writes into that branch, not into the project).
        let speculate = !args.no_speculate && settings.speculation;
        let mut tools = ToolRegistry::configured(&llm.settings.tools);
        let mcp = runtime.block_on(crate::cmd_exec::connect_mcp(
            &llm.settings.tools,
            workspace.root(),
            &mut tools,
        ));
        let mut ctx = ToolContext::new(workspace);
        ctx.background = Some(llm.background.clone());
        ctx.token_stats = Some(llm.stats.clone());
        // Lints run only in branches (the session's shadow, speculations): in the real tree
        // the checker would write its build output there. The `diagnostics` tool is offered
        // only where every live turn has a branch; speculations keep the session's tools.
        if args.shadow || speculate {
            ctx.lint = shade_agent::tools::diagnostics::session_hook(
                ctx.workspace.root(),
                &llm.settings.lint,
                args.shadow,
            );
            if args.shadow && ctx.lint.is_some() {
                tools.add(Arc::new(shade_agent::tools::diagnostics::Diagnostics));
            }
        }
        let live = if args.shadow || args.unconfined {
            None
        } else {
            let live = Live::start(ctx.workspace.root(), ShadowOptions::live()).context(
                "cannot create the session's branch (FUSE); `--unconfined` runs without one, \
                 writing straight into the project",
            )?;
            tools = live.wrap(&tools);
            Some(live)
        };
        let mut agent = Agent::new(
            llm.provider.clone(),
            tools,
            ctx,
            approver_dyn,
            AgentOptions {
                model: llm.model.clone(),
                max_turns: args.max_turns,
                approval: args.approval,
                temperature: None,
            },
        );
        let id = new_session_id();
        if settings.telemetry {
            agent.set_telemetry(shade_agent::followup::telemetry::Telemetry::from_env(id));
        }
        let shadow = if args.shadow {
            let shadow =
                Shadow::create_served(agent.context().workspace.root(), ShadowOptions::live())
                    .context("cannot create the session's branch")?;
            agent = agent.fork_into(&shadow, args.approval);
            Some(shadow)
        } else {
            None
        };
        let saved = resumed
            .clone()
            .unwrap_or_else(|| SavedSession::new(&dir, &llm.model, args.shadow));
        let conversation = match resumed {
            Some(r) => resumed_conversation(&agent, r.messages),
            None => Vec::new(),
        };
        let turn_no = saved.user_prompts().count();
        Ok(Session {
            agent,
            shadow,
            live,
            turn_no,
            conversation,
            llm,
            approver,
            suggest: !args.no_suggest && settings.suggestions,
            speculate,
            settings,
            last_turn_failed: false,
            last_prompt_tokens: Arc::new(Mutex::new(0)),
            id,
            runtime,
            saved,
            store,
            mcp: Some(mcp),
        })
    }

    /// Save the conversation as it is now (after a turn, a compaction); a failure is told
    /// once per call and the session goes on.
    pub fn save(&mut self) {
        if self.conversation.is_empty() {
            return;
        }
        self.saved.messages = self.conversation.clone();
        self.saved.model = self.agent.options().model.clone();
        self.saved.shadow |= self.shadow.is_some();
        if let Err(e) = self.store.save(&mut self.saved) {
            eprintln!("shade: could not save the conversation: {e}");
        }
    }

    /// What a resumed session shows first: which conversation, and how it ended.
    pub fn resume_summary(&self) -> Option<String> {
        if self.conversation.is_empty() {
            return None;
        }
        let prompts = self.saved.user_prompts().count();
        let mut out = format!(
            "resumed conversation {} ({}): {}",
            self.saved.id,
            shade_agent::tools::text::plural(prompts, "prompt"),
            self.saved.title()
        );
        let last_user = self.saved.user_prompts().last().map(one_line);
        let last_answer = self.conversation.iter().rev().find_map(|m| match m {
            Message::Assistant { content, .. } if !content.trim().is_empty() => {
                Some(one_line(content))
            }
            _ => None,
        });
        if let Some(u) = last_user.filter(|_| prompts > 1) {
            out.push_str(&format!("\n  last prompt: {u}"));
        }
        if let Some(a) = last_answer {
            out.push_str(&format!("\n  last answer: {a}"));
        }
        if self.saved.shadow {
            out.push_str(
                "\n  (it ran in a branch: edits it did not accept are not in the project)",
            );
        }
        Some(out)
    }

    /// Add the user's prompt and run the agent until it answers. Compacts first when the last
    /// request filled the context past the threshold, and once more (then retries) when the
    /// server says the context is too long.
    pub async fn turn(
        &mut self,
        prompt: &str,
        sink: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<RunOutcome, AgentError> {
        let prompt = with_mentions(prompt, &self.agent.context().workspace);
        self.next_turn();
        if !self.conversation.is_empty() && self.context_nearly_full() {
            self.compact_reporting(sink, cancel).await;
        }
        self.add_user_message(prompt);
        let tokens = self.last_prompt_tokens.clone();
        let inner = sink.clone();
        let metered: EventSink = Arc::new(move |e: AgentEvent| {
            if let AgentEvent::Usage { prompt_tokens, .. } = &e {
                if let Ok(mut t) = tokens.lock() {
                    *t = *prompt_tokens;
                }
            }
            inner(e)
        });
        let mut result = self
            .agent
            .run(&mut self.conversation, &metered, cancel)
            .await;
        if matches!(&result, Err(AgentError::Llm(e)) if e.is_context_too_long())
            && self.compact_reporting(sink, cancel).await.is_some()
        {
            result = self
                .agent
                .run(&mut self.conversation, &metered, cancel)
                .await;
        }
        self.last_turn_failed = match &result {
            Ok(o) => o.stop == StopReason::Error,
            Err(_) => true,
        };
        result
    }

    /// Run a turn to its end on the session's runtime; Ctrl-C (SIGINT: the terminal is in
    /// cooked mode during a turn) cancels the model call and running tools, and the turn
    /// ends with the conversation still well-formed.
    pub fn turn_until_ctrl_c(
        &mut self,
        prompt: &str,
        sink: &EventSink,
    ) -> Result<RunOutcome, AgentError> {
        let cancel = self.new_turn();
        let runtime = self.runtime.clone();
        let result = until_ctrl_c(&runtime, &cancel, self.turn(prompt, sink, &cancel));
        self.settle_live();
        result
    }

    /// A new turn begins: its accepts are named after it.
    pub fn next_turn(&mut self) {
        self.turn_no += 1;
        if let Some(live) = &self.live {
            live.set_origin(self.history_origin());
        }
    }

    /// End of a turn in a live session: what a read-only call changed after all is accepted
    /// too (a pending conflict stays pending).
    fn settle_live(&self) {
        if let Some(live) = &self.live {
            live.settle();
        }
    }

    /// `!command`: the user's own shell command, run where the agent's commands run (the
    /// project, or the session's branch) with the same limits; Ctrl-C stops it. Its output
    /// is shown and put in the conversation, so the model knows what the user saw.
    pub fn run_user_command(&mut self, command: &str) {
        let Some(shell) = self.agent.tool("shell") else {
            eprintln!("shade: this session has no shell tool");
            return;
        };
        let mut ctx = self.agent.context().clone();
        // The user's own command: it may ask on the terminal (a password prompt).
        ctx.user_terminal = true;
        self.next_turn();
        let cancel = self.new_turn();
        let runtime = self.runtime.clone();
        let args = serde_json::json!({ "command": command });
        let result = until_ctrl_c(&runtime, &cancel, shell.run(args, &ctx, &cancel));
        self.settle_live();
        let content = match result {
            Ok(out) => out.content,
            Err(shade_agent::tools::ToolError::Cancelled) => {
                println!("(cancelled)");
                "Cancelled by the user before it finished.".to_string()
            }
            Err(e) => format!("Could not run: {e}"),
        };
        println!(
            "{}",
            shade_fusefs::quote::visible_controls(content.trim_end())
        );
        let note = format!(
            "I ran this shell command myself; its result is for your information:\n$ {command}\n{content}"
        );
        self.add_user_message(note);
    }

    /// How this session's accepts are named in the project's history: the session and the
    /// turn (the number of prompts so far).
    pub fn history_origin(&self) -> String {
        format!("{}turn {}", self.history_prefix(), self.turn_no)
    }

    /// What every history origin of this session starts with.
    pub fn history_prefix(&self) -> String {
        format!("chat session {} ", self.saved.id)
    }

    /// The project directory as the user knows it.
    pub fn project(&self) -> &std::path::Path {
        &self.saved.project
    }

    /// A note for the model (something the user did outside the turns, e.g. `/undo`).
    pub fn note_for_model(&mut self, note: String) {
        if !self.conversation.is_empty() {
            self.add_user_message(note);
        }
    }

    /// The user's message, starting the conversation (system prompt first) if there is none.
    fn add_user_message(&mut self, content: String) {
        if self.conversation.is_empty() {
            self.conversation = self.agent.start_conversation(&content);
        } else {
            self.conversation.push(Message::User { content });
        }
    }

    /// Go on with the turn the conversation ends in (after a speculation accepted at a
    /// boundary): the model continues from the results it has.
    pub fn continue_until_ctrl_c(&mut self, sink: &EventSink) -> Result<RunOutcome, AgentError> {
        let cancel = self.new_turn();
        let runtime = self.runtime.clone();
        let result = until_ctrl_c(
            &runtime,
            &cancel,
            self.agent.run(&mut self.conversation, sink, &cancel),
        );
        self.settle_live();
        self.last_turn_failed = !matches!(&result, Ok(o) if o.stop != StopReason::Error);
        result
    }

    /// `/try N PROMPT`: N attempts at the prompt from the conversation so far, each in its
    /// own branch (off the session's branch in a `--shadow` session, so accepting writes
    /// there), checked by `check`; the best that passed is accepted, the others dropped,
    /// and the conversation goes on from the accepted one's. Ctrl-C drops them all.
    pub fn try_attempts(&mut self, n: usize, check: Option<String>, prompt: &str) {
        use crate::attempts::{self, Decision, Plan};
        let prompt = with_mentions(prompt, &self.agent.context().workspace);
        let history = if self.conversation.is_empty() {
            self.agent
                .start_conversation("")
                .into_iter()
                .take(1)
                .collect()
        } else {
            self.conversation.clone()
        };
        let plan = Plan {
            attempts: n,
            check,
            check_timeout: std::time::Duration::from_secs(600),
            models: Vec::new(),
            jobs: std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get),
            approval: self.agent.options().approval,
            max_turns: 50,
            prompt: prompt.clone(),
            history,
            base: self.shadow.as_ref().map(Shadow::base),
        };
        let root = match &self.shadow {
            Some(s) => s.project().to_path_buf(),
            None => self.agent.context().workspace.root().to_path_buf(),
        };
        let mut llm_view = LlmSetup {
            provider: self.llm.provider.clone(),
            model: self.agent.options().model.clone(),
            background: self.llm.background.clone(),
            stats: self.llm.stats.clone(),
            settings: self.llm.settings.clone(),
        };
        llm_view.settings.followup = self.settings;
        let tools = self.agent.tools().clone();
        let cancel = self.new_turn();
        let runtime = self.runtime.clone();
        let stopped = std::sync::atomic::AtomicI32::new(0);
        println!("trying {n} attempts in branches…");
        let done = until_ctrl_c(
            &runtime,
            &cancel,
            attempts::run_all(&plan, &root, &llm_view, &tools, &cancel, &stopped, false),
        );
        let Ok(done) = done else {
            println!("(cancelled: every attempt was dropped)");
            return;
        };
        let conversations: Vec<(usize, Vec<Message>)> = done
            .attempts
            .iter()
            .map(|a| (a.index, a.conversation.clone()))
            .collect();
        let (_, accepted) = attempts::finish(done, Decision::PickBest, false);
        match accepted.and_then(|i| conversations.into_iter().find(|(j, _)| *j == i)) {
            Some((i, conversation)) => {
                self.conversation = conversation;
                self.last_turn_failed = false;
                println!("continuing from attempt {i}");
                self.save();
            }
            None => println!("nothing accepted; the conversation goes on as before /try"),
        }
    }

    /// A token for a new turn, known to the approver (Ctrl-C at a question cancels it).
    fn new_turn(&self) -> CancellationToken {
        let cancel = CancellationToken::new();
        if let Some(a) = &self.approver {
            a.set_turn(cancel.clone());
        }
        cancel
    }

    /// A speculated turn was accepted in place of a live one.
    pub fn after_speculated_turn(&mut self) {
        self.last_turn_failed = false;
    }

    fn context_nearly_full(&self) -> bool {
        let used = self.last_prompt_tokens.lock().map(|t| *t).unwrap_or(0);
        let window = self.llm.settings.llm.context_window as f64;
        used as f64 >= window * self.llm.settings.llm.compact_threshold
    }

    /// Compact now (`/compact`, or automatically).
    pub async fn compact(
        &mut self,
        cancel: &CancellationToken,
    ) -> Result<CompactReport, CompactError> {
        let report = compact(
            &self.llm.background,
            &mut self.conversation,
            KEEP_TURNS,
            cancel,
        )
        .await?;
        if let Ok(mut t) = self.last_prompt_tokens.lock() {
            *t = 0;
        }
        Ok(report)
    }

    async fn compact_reporting(
        &mut self,
        sink: &EventSink,
        cancel: &CancellationToken,
    ) -> Option<CompactReport> {
        eprintln!("shade: context nearly full: summarising older messages…");
        match self.compact(cancel).await {
            Ok(r) => {
                eprintln!(
                    "shade: summarised {} older messages, kept the last {}",
                    r.summarised, r.kept
                );
                Some(r)
            }
            // Ctrl-C: the turn ends as cancelled, which says so.
            Err(CompactError::Llm(LlmError::Cancelled)) => None,
            Err(e) => {
                sink(AgentEvent::Error {
                    message: format!("could not compact the conversation: {e}"),
                });
                None
            }
        }
    }

    /// Replace the session's branch with a fresh one (after accept or abort); the agent
    /// keeps its model and approval mode.
    pub fn renew_shadow(&mut self) -> anyhow::Result<()> {
        let root = self.agent.context().workspace.shown_root().to_path_buf();
        let shadow = Shadow::create_served(&root, ShadowOptions::live())
            .context("cannot create a new branch for the session")?;
        self.agent = self.agent.fork_into(&shadow, self.agent.options().approval);
        self.shadow = Some(shadow);
        Ok(())
    }

    /// After a turn in a shadow session: one line saying what the branch now holds, in the
    /// project and outside it (None when it holds nothing), so a write to `~/.bashrc` is
    /// seen when it happens, not only at `/accept`.
    pub fn branch_summary(&self) -> Option<String> {
        if let Some(live) = &self.live {
            return crate::cmd_exec::live_summary(live);
        }
        let shadow = self.shadow.as_ref()?;
        let n = shadow.changeset(false).changes.len();
        let outside = crate::outside::summary(&shadow.outside(), 5);
        if n == 0 && outside.is_none() {
            return None;
        }
        let mut line = format!(
            "in the branch: {}",
            shade_agent::tools::text::plural(n, "change")
        );
        if let Some(o) = outside {
            line.push_str("; ");
            line.push_str(&o);
        }
        line.push_str(" (/changes, /diff, /accept, /abort)");
        Some(line)
    }

    /// At the end of the session: say what a shadow branch held that is now dropped.
    pub fn close(&mut self) {
        if let Some(live) = self.live.take() {
            crate::cmd_exec::close_live(&live);
        }
        if let Some(shadow) = self.shadow.take() {
            let changes = shadow.changeset(false);
            if !changes.changes.is_empty() {
                eprintln!(
                    "shade: dropped the session's branch with {} never accepted:",
                    shade_agent::tools::text::plural(changes.changes.len(), "change")
                );
                for c in &changes.changes {
                    eprintln!("  {c}");
                }
            }
            if let Some(line) = crate::outside::summary(&shadow.outside(), 10) {
                eprintln!("shade: dropped with it, never kept: {line}");
            }
            shadow.abort();
        }
    }

    /// Forget the conversation (`/clear`); the next turn starts a new saved one.
    pub fn clear(&mut self) {
        self.conversation.clear();
        self.saved = SavedSession::new(
            &self.saved.project,
            &self.agent.options().model,
            self.shadow.is_some(),
        );
        self.turn_no = 0;
        self.last_turn_failed = false;
        if let Ok(mut t) = self.last_prompt_tokens.lock() {
            *t = 0;
        }
    }
}

/// `prompt` with the files it @-mentions attached, saying what was attached (a line each,
/// like a tool call) and what could not be.
pub(crate) fn with_mentions(prompt: &str, workspace: &Workspace) -> String {
    let expanded = shade_agent::mentions::expand(prompt, workspace);
    for (mention, note) in &expanded.attached {
        println!("  @ {mention} ({note})");
    }
    for (mention, why) in &expanded.refused {
        eprintln!("shade: @{mention} not attached: {why}");
    }
    expanded.text
}

/// A saved conversation made current: today's system prompt (instructions and memories may
/// have changed), saying the conversation was resumed, so the model reads files again before
/// trusting what it read back then.
fn resumed_conversation(agent: &Agent, mut messages: Vec<Message>) -> Vec<Message> {
    let fresh = agent.start_conversation("");
    if let (Some(Message::System { content }), Some(Message::System { .. })) =
        (fresh.into_iter().next(), messages.first())
    {
        messages[0] = Message::System {
            content: format!(
                "{content}\n\nThis conversation was resumed from a saved session: files may \
                 have changed since, so read them again before relying on earlier contents."
            ),
        };
    }
    messages
}

/// Drive `work` on `runtime`, cancelling `cancel` on Ctrl-C meanwhile.
pub(crate) fn until_ctrl_c<F: std::future::Future>(
    runtime: &tokio::runtime::Handle,
    cancel: &CancellationToken,
    work: F,
) -> F::Output {
    runtime.block_on(async {
        let on_ctrl_c = cancel.clone();
        let watcher = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                on_ctrl_c.cancel();
            }
        });
        let result = work.await;
        watcher.abort();
        result
    })
}
