//! The shade agent: LLM client, tools, query loop (see DESIGN.md "The agent").

pub mod llm;
