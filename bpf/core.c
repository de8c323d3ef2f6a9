//go:build ignore

/* The shared maps alone (see include/common.h): the agent creates and pins
 * them from this object before loading any hook group, so every group and
 * every later agent adopts the same instances. */
#include "common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";
