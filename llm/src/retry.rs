//! The resilience layer around single attempts: bounded exponential backoff with jitter on
//! retryable errors (honouring `Retry-After`), and model switching as the query-engine seed
//! describes (context too large → larger-context model; rate limited → backup model).

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::error::LlmError;
use super::types::{Completion, LlmEvent};

/// Longest `Retry-After` we are willing to sit through.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(120);

/// How many times and how long to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Delay before the first retry (doubled each time).
    pub base_delay: Duration,
    /// Cap of the exponential delay.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// Delay before retry number `retry` (1-based): `base·2^(retry-1)` capped, with "equal
    /// jitter" (half fixed, half random) so that many clients do not retry in lockstep. A
    /// server-given `Retry-After` is a floor.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20))
            .min(self.max_delay);
        let half = exp / 2;
        let jittered = half + half.mul_f64(fastrand::f64());
        match retry_after {
            Some(ra) => ra.min(MAX_RETRY_AFTER).max(jittered),
            None => jittered,
        }
    }
}

/// Which models may be used for one logical call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelPlan {
    /// First choice.
    pub primary: String,
    /// Switch here when the request does not fit the context window.
    pub large_context: Option<String>,
    /// Switch here when rate limited.
    pub backup: Option<String>,
}

/// A failed attempt, and whether it had already shown output (then it cannot be retried
/// without duplicating what the user saw).
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptFailure {
    /// The error.
    pub error: LlmError,
    /// Text or tool calls were already emitted.
    pub produced_output: bool,
}

impl From<LlmError> for AttemptFailure {
    fn from(error: LlmError) -> Self {
        Self {
            error,
            produced_output: false,
        }
    }
}

/// Run `attempt(model)` until it succeeds, the error is final, or retries are used up.
pub async fn with_retries<F, Fut>(
    policy: RetryPolicy,
    plan: &ModelPlan,
    on_event: &(dyn Fn(LlmEvent) + Send + Sync),
    cancel: &CancellationToken,
    mut attempt: F,
) -> Result<Completion, LlmError>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<Completion, AttemptFailure>>,
{
    let mut model = plan.primary.clone();
    let mut retries = 0u32;
    let mut used_large = false;
    let mut used_backup = false;
    loop {
        if cancel.is_cancelled() {
            return Err(LlmError::Cancelled);
        }
        let failure = match attempt(model.clone()).await {
            Ok(c) => return Ok(c),
            Err(f) => f,
        };
        let err = failure.error;
        if err == LlmError::Cancelled || failure.produced_output {
            return Err(err);
        }
        if err.is_context_too_long() {
            match plan.large_context.as_ref() {
                Some(large) if !used_large && *large != model => {
                    used_large = true;
                    on_event(LlmEvent::ModelSwitch {
                        from: model.clone(),
                        to: large.clone(),
                        reason: "context too long".into(),
                    });
                    model = large.clone();
                    continue;
                }
                _ => return Err(err),
            }
        }
        if err.is_rate_limited() {
            if let Some(backup) = plan.backup.as_ref() {
                if !used_backup && *backup != model {
                    used_backup = true;
                    on_event(LlmEvent::ModelSwitch {
                        from: model.clone(),
                        to: backup.clone(),
                        reason: "rate limited".into(),
                    });
                    model = backup.clone();
                    continue;
                }
            }
        }
        if !err.is_retryable() || retries >= policy.max_retries {
            return Err(err);
        }
        retries += 1;
        let retry_after = match &err {
            LlmError::Http { retry_after, .. } => *retry_after,
            _ => None,
        };
        let delay = policy.delay(retries, retry_after);
        // The caller shows the Retry event; a warning here would say it twice.
        tracing::debug!(attempt = retries, ?delay, error = %err, "model call failed, retrying");
        on_event(LlmEvent::Retry {
            attempt: retries,
            delay_ms: delay.as_millis() as u64,
            reason: err.to_string(),
        });
        tokio::select! {
            _ = cancel.cancelled() => return Err(LlmError::Cancelled),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Parse `Retry-After` (seconds; HTTP dates are ignored) or OpenAI's `retry-after-ms`.
pub fn parse_retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    let secs = get("retry-after")?.trim().parse::<f64>().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::FinishReason;
    use std::sync::{Arc, Mutex};

    fn ok(model: &str) -> Completion {
        Completion {
            model: model.into(),
            text: "ok".into(),
            reasoning: String::new(),
            tool_calls: vec![],
            finish_reason: FinishReason::Stop,
            usage: None,
        }
    }

    fn http(status: u16, message: &str) -> AttemptFailure {
        LlmError::Http {
            status,
            message: message.into(),
            retry_after: None,
        }
        .into()
    }

    const FAST: RetryPolicy = RetryPolicy {
        max_retries: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(4),
    };

    #[test]
    fn delay_grows_and_honours_retry_after() {
        let p = RetryPolicy {
            max_retries: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for _ in 0..50 {
            let d1 = p.delay(1, None);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
            let d4 = p.delay(4, None);
            assert!(d4 >= Duration::from_millis(400) && d4 <= Duration::from_millis(800));
            assert!(p.delay(30, None) <= Duration::from_secs(1));
            assert_eq!(
                p.delay(1, Some(Duration::from_secs(3))),
                Duration::from_secs(3)
            );
        }
    }

    async fn run(
        plan: ModelPlan,
        script: Vec<Result<(), AttemptFailure>>,
    ) -> (Result<Completion, LlmError>, Vec<String>, Vec<LlmEvent>) {
        let script = Arc::new(Mutex::new(script.into_iter()));
        let models = Arc::new(Mutex::new(Vec::new()));
        let events = Arc::new(Mutex::new(Vec::new()));
        let ev = events.clone();
        let sink = move |e: LlmEvent| ev.lock().expect("lock").push(e);
        let res = with_retries(FAST, &plan, &sink, &CancellationToken::new(), |m| {
            models.lock().expect("lock").push(m.clone());
            let next = script.lock().expect("lock").next();
            async move {
                match next {
                    Some(Ok(())) => Ok(ok(&m)),
                    Some(Err(f)) => Err(f),
                    None => Err(LlmError::Malformed("script exhausted".into()).into()),
                }
            }
        })
        .await;
        let m = models.lock().expect("lock").clone();
        let e = events.lock().expect("lock").clone();
        (res, m, e)
    }

    fn plan() -> ModelPlan {
        ModelPlan {
            primary: "main".into(),
            large_context: Some("big".into()),
            backup: Some("backup".into()),
        }
    }

    #[tokio::test]
    async fn retries_5xx_then_succeeds() {
        let (res, models, events) = run(
            ModelPlan {
                backup: None,
                ..plan()
            },
            vec![Err(http(503, "x")), Err(http(500, "y")), Ok(())],
        )
        .await;
        assert!(res.is_ok());
        assert_eq!(models, vec!["main", "main", "main"]);
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, LlmEvent::Retry { .. }))
                .count(),
            2
        );
    }

    #[tokio::test]
    async fn never_retries_auth_errors() {
        let (res, models, _) = run(plan(), vec![Err(http(401, "bad key")), Ok(())]).await;
        assert!(matches!(res, Err(LlmError::Http { status: 401, .. })));
        assert_eq!(models.len(), 1);
    }

    #[tokio::test]
    async fn gives_up_after_max_retries() {
        let (res, models, _) = run(
            ModelPlan {
                backup: None,
                ..plan()
            },
            vec![Err(http(502, "a")); 10],
        )
        .await;
        assert!(res.is_err());
        assert_eq!(models.len(), 4);
    }

    #[tokio::test]
    async fn switches_models() {
        let (res, models, _) = run(
            plan(),
            vec![
                Err(http(400, "maximum context length exceeded")),
                Err(http(429, "slow down")),
                Ok(()),
            ],
        )
        .await;
        assert_eq!(res.map(|c| c.model).ok().as_deref(), Some("backup"));
        assert_eq!(models, vec!["main", "big", "backup"]);
    }

    #[tokio::test]
    async fn no_retry_after_visible_output() {
        let (res, models, _) = run(
            plan(),
            vec![
                Err(AttemptFailure {
                    error: LlmError::Truncated("x".into()),
                    produced_output: true,
                }),
                Ok(()),
            ],
        )
        .await;
        assert!(matches!(res, Err(LlmError::Truncated(_))));
        assert_eq!(models.len(), 1);
    }
}
