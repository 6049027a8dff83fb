//! The cache-safe prefix of a conversation (the seed's `CacheSafeParams`): what a background
//! request must repeat byte for byte — system prompt, tools, history — so that a
//! prefix-caching server serves it from the main conversation's cache. It is saved after each
//! completed main turn and bound to its session: the peer leaked one session's prefix into
//! another's suggestions and speculation (its bugs #9233 and #9470).

use std::sync::{Arc, Mutex};

use crate::llm::{Message, ToolSpec};

/// History entries kept in a saved prefix at most.
pub const MAX_HISTORY_FOR_CACHE: usize = 40;

/// A snapshot of the main conversation's cacheable prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSafeParams {
    /// The session it was taken from; never used for another one.
    pub session: u64,
    /// The system prompt, as sent.
    pub system: Message,
    /// The tools, as sent (same order).
    pub tools: Vec<ToolSpec>,
    /// The conversation after the system prompt: its last ≤ 40 entries, cut where no tool
    /// call is separated from its result.
    pub history: Vec<Message>,
    /// The main model.
    pub model: String,
    /// Bumped only when the system prompt or the tools change (the prefix cache is cold then).
    pub version: u64,
}

impl CacheSafeParams {
    /// Snapshot `conversation` (system prompt first) and `tools` after a main turn. `None`
    /// when there is no system prompt first, or when the last assistant message still waits
    /// for tool results (a turn in progress is no prefix to fork from). `previous` (the last
    /// snapshot of the same session) carries the version on; from another session it is
    /// ignored.
    pub fn capture(
        session: u64,
        conversation: &[Message],
        tools: &[ToolSpec],
        model: &str,
        previous: Option<&CacheSafeParams>,
    ) -> Option<Self> {
        let (system, rest) = conversation.split_first()?;
        if !matches!(system, Message::System { .. }) || has_pending_tool_calls(rest) {
            return None;
        }
        let version = match previous.filter(|p| p.session == session) {
            Some(p) if same_json(&p.system, system) && same_json(p.tools.as_slice(), tools) => {
                p.version
            }
            Some(p) => p.version + 1,
            None => 0,
        };
        Some(Self {
            session,
            system: system.clone(),
            tools: tools.to_vec(),
            history: rest[safe_start(rest, MAX_HISTORY_FOR_CACHE)..].to_vec(),
            model: model.to_string(),
            version,
        })
    }

    /// The messages of a forked request: the saved prefix, then `extra` (the fork's question).
    pub fn fork_messages(&self, extra: Message) -> Vec<Message> {
        let mut messages = Vec::with_capacity(self.history.len() + 2);
        messages.push(self.system.clone());
        messages.extend(self.history.iter().cloned());
        messages.push(extra);
        messages
    }
}

/// Does the last assistant message have a tool call with no `Tool` result after it?
pub fn has_pending_tool_calls(messages: &[Message]) -> bool {
    let Some(last) = messages
        .iter()
        .rposition(|m| matches!(m, Message::Assistant { .. }))
    else {
        return false;
    };
    let Message::Assistant { tool_calls, .. } = &messages[last] else {
        return false;
    };
    tool_calls.iter().any(|call| {
        !messages[last + 1..]
            .iter()
            .any(|m| matches!(m, Message::Tool { tool_call_id, .. } if *tool_call_id == call.id))
    })
}

/// Where to start keeping `history` so that at most `max` entries remain and the first one is
/// not a tool result (whose call would have been cut off). Tool results follow their call, so
/// a kept call always keeps its results. Returns `history.len()` when nothing can be kept.
fn safe_start(history: &[Message], max: usize) -> usize {
    let earliest = history.len().saturating_sub(max);
    (earliest..history.len())
        .find(|&i| !matches!(history[i], Message::Tool { .. }))
        .unwrap_or(history.len())
}

fn same_json<T: serde::Serialize + ?Sized>(a: &T, b: &T) -> bool {
    match (serde_json::to_string(a), serde_json::to_string(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A fresh random session id (a new `shade chat`, or `/clear`).
pub fn new_session_id() -> u64 {
    fastrand::u64(..)
}

#[derive(Debug)]
struct Slot {
    session: u64,
    params: Option<CacheSafeParams>,
}

/// The saved prefix of one session, shared by the REPL, the suggestion and the speculation
/// tasks. It only ever holds a prefix of its own session and only hands it out to a caller
/// naming that session, so a prefix cannot leak into another session's requests.
#[derive(Debug, Clone)]
pub struct SessionPrefix {
    slot: Arc<Mutex<Slot>>,
}

impl SessionPrefix {
    /// An empty holder for `session`.
    pub fn new(session: u64) -> Self {
        Self {
            slot: Arc::new(Mutex::new(Slot {
                session,
                params: None,
            })),
        }
    }

    /// The session the holder belongs to.
    pub fn session(&self) -> u64 {
        self.slot.lock().map(|s| s.session).unwrap_or(0)
    }

    /// Keep `params` as the session's prefix. Refused (returns false, the old one stays) when
    /// they were taken in another session.
    pub fn save(&self, params: CacheSafeParams) -> bool {
        let Ok(mut slot) = self.slot.lock() else {
            return false;
        };
        if params.session != slot.session {
            tracing::warn!(
                "refusing a cache-safe prefix of session {:x} for session {:x}",
                params.session,
                slot.session
            );
            return false;
        }
        slot.params = Some(params);
        true
    }

    /// Capture the prefix of `conversation` after a completed main turn and save it (the
    /// version carried on from the saved one). Returns the saved prefix, or `None` (and the
    /// previous prefix is dropped) when the turn is not a safe fork point.
    pub fn update(
        &self,
        conversation: &[Message],
        tools: &[ToolSpec],
        model: &str,
    ) -> Option<CacheSafeParams> {
        let mut slot = self.slot.lock().ok()?;
        let params = CacheSafeParams::capture(
            slot.session,
            conversation,
            tools,
            model,
            slot.params.as_ref(),
        );
        slot.params = params.clone();
        params
    }

    /// The saved prefix, if there is one and `session` is the holder's.
    pub fn get(&self, session: u64) -> Option<CacheSafeParams> {
        let slot = self.slot.lock().ok()?;
        if slot.session != session {
            return None;
        }
        slot.params.clone()
    }

    /// Forget the saved prefix (the conversation was compacted or failed).
    pub fn clear(&self) {
        if let Ok(mut slot) = self.slot.lock() {
            slot.params = None;
        }
    }

    /// Forget the saved prefix and bind the holder to a new session (`/clear`, a new chat).
    pub fn start_session(&self, session: u64) {
        if let Ok(mut slot) = self.slot.lock() {
            *slot = Slot {
                session,
                params: None,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolCall;

    fn sys(s: &str) -> Message {
        Message::System { content: s.into() }
    }
    fn user(s: &str) -> Message {
        Message::User { content: s.into() }
    }
    fn answer(s: &str) -> Message {
        Message::Assistant {
            content: s.into(),
            tool_calls: vec![],
        }
    }
    fn calls(ids: &[&str]) -> Message {
        Message::Assistant {
            content: String::new(),
            tool_calls: ids
                .iter()
                .map(|id| ToolCall {
                    id: id.to_string(),
                    name: "read_file".into(),
                    arguments: "{}".into(),
                })
                .collect(),
        }
    }
    fn result(id: &str) -> Message {
        Message::Tool {
            tool_call_id: id.into(),
            content: "ok".into(),
        }
    }
    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: "d".into(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    #[test]
    fn pending_tool_calls_are_no_fork_point() {
        let conv = vec![sys("s"), user("u"), calls(&["a", "b"]), result("a")];
        assert!(CacheSafeParams::capture(1, &conv, &[], "m", None).is_none());
        let mut done = conv.clone();
        done.push(result("b"));
        done.push(answer("fixed"));
        let p = CacheSafeParams::capture(1, &done, &[], "m", None).expect("complete turn");
        assert_eq!(p.history, done[1..]);
        assert_eq!(p.system, sys("s"));
        // Without a system prompt first there is nothing to fork.
        assert!(CacheSafeParams::capture(1, &done[1..], &[], "m", None).is_none());
    }

    #[test]
    fn version_bumps_only_when_system_or_tools_change() {
        let conv = vec![sys("s"), user("u"), answer("a")];
        let tools = vec![tool("read_file")];
        let p0 = CacheSafeParams::capture(7, &conv, &tools, "m", None).expect("p0");
        assert_eq!(p0.version, 0);
        let mut longer = conv.clone();
        longer.extend([user("more"), answer("b")]);
        let p1 = CacheSafeParams::capture(7, &longer, &tools, "m", Some(&p0)).expect("p1");
        assert_eq!(p1.version, 0, "new history alone keeps the version");
        let more_tools = vec![tool("read_file"), tool("grep")];
        let p2 = CacheSafeParams::capture(7, &longer, &more_tools, "m", Some(&p1)).expect("p2");
        assert_eq!(p2.version, 1);
        let mut new_sys = longer.clone();
        new_sys[0] = sys("s2");
        let p3 = CacheSafeParams::capture(7, &new_sys, &more_tools, "m", Some(&p2)).expect("p3");
        assert_eq!(p3.version, 2);
        // A previous snapshot of another session does not count.
        let other = CacheSafeParams::capture(8, &new_sys, &more_tools, "m", Some(&p3)).expect("o");
        assert_eq!((other.session, other.version), (8, 0));
    }

    #[test]
    fn history_is_cut_to_40_at_a_safe_place() {
        // 1 user + 20 × (call, result) + final answer = 42 after the system prompt: the last
        // 40 would start on the result of call c0, whose call is cut off.
        let mut conv = vec![sys("s"), user("go")];
        for i in 0..20 {
            let id = format!("c{i}");
            conv.push(calls(&[&id]));
            conv.push(result(&id));
        }
        conv.push(answer("done"));
        assert_eq!(conv.len() - 1, 42);
        assert_eq!(conv[1 + 42 - 40], result("c0"));
        let p = CacheSafeParams::capture(1, &conv, &[], "m", None).expect("p");
        assert_eq!(p.history.len(), 39);
        assert_eq!(p.history[0], calls(&["c1"]));
        // Every kept result has its call kept.
        for (i, m) in p.history.iter().enumerate() {
            if let Message::Tool { tool_call_id, .. } = m {
                assert!(p.history[..i].iter().any(|c| matches!(c,
                    Message::Assistant { tool_calls, .. } if tool_calls.iter().any(|t| &t.id == tool_call_id))));
            }
        }
        assert_eq!(p.history.last(), Some(&answer("done")));
        // A call with several results: the cut skips all of them.
        let mut conv = vec![sys("s"), user("go"), calls(&["a", "b", "c"])];
        conv.extend([result("a"), result("b"), result("c"), answer("x")]);
        let start = safe_start(&conv[1..], 3);
        assert_eq!(conv[1..][start], answer("x"));
    }

    #[test]
    fn fork_messages_repeat_the_prefix_then_the_question() {
        let conv = vec![sys("s"), user("u"), answer("a")];
        let p = CacheSafeParams::capture(1, &conv, &[], "m", None).expect("p");
        let f = p.fork_messages(user("q"));
        assert_eq!(f[..3], conv[..]);
        assert_eq!(f[3], user("q"));
    }

    #[test]
    fn session_prefix_never_crosses_sessions() {
        let holder = SessionPrefix::new(1);
        let conv = vec![sys("s"), user("u"), answer("a")];
        let foreign = CacheSafeParams::capture(2, &conv, &[], "m", None).expect("p");
        assert!(!holder.save(foreign));
        assert!(holder.get(1).is_none());
        let saved = holder.update(&conv, &[], "m").expect("update");
        assert_eq!(saved.session, 1);
        assert_eq!(holder.get(1), Some(saved));
        assert!(holder.get(2).is_none(), "asked for by another session");
        // /clear: a new session starts empty, the old id no longer answers.
        holder.start_session(3);
        assert!(holder.get(1).is_none());
        assert!(holder.get(3).is_none());
        holder.update(&conv, &[], "m").expect("update");
        assert_eq!(holder.get(3).map(|p| p.session), Some(3));
        holder.clear();
        assert!(holder.get(3).is_none());
        // A turn left pending drops the stale prefix.
        holder.update(&conv, &[], "m").expect("update");
        let pending = vec![sys("s"), user("u"), calls(&["z"])];
        assert!(holder.update(&pending, &[], "m").is_none());
        assert!(holder.get(3).is_none());
    }
}
