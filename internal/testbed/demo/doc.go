// Package demo runs the main job end to end on one machine: a model-server
// simulator with four slots, the endpoint picker in standalone mode with the
// premium/regular policy of SPEC §11, and the local ext_proc gateway, all as
// real processes on loopback; then the weighted-share workload through the
// gateway, once with quanta 512:128 and once with the 512:512 control. It
// prints the completion shares and draws cumulative completions per class.
package demo
