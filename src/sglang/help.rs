//! SGLang: help (being built).
