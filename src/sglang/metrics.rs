//! SGLang: metrics (being built).
