//! The OpenAI-compatible server. Its first piece is the one error shape every endpoint
//! returns, so that clients (and our own benchmark) can always classify a failure.

pub mod error;
