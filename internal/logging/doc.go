// Package logging builds the JSON logger that Laneway's long-running
// binaries (the picker, the local gateway) write with: standard level
// names ("info" with the logr verbosity as "v", "error"), which log
// pipelines read, instead of zap's "Level(-n)" for logr's V(n) lines.
package logging
