package egress

//go:generate go tool bpf2go -tags linux -target amd64 -type net_event -type net_config -type allow_key -type admit_val -type admit_span -type cidr_key -type cidr_val -type port_range -type dns_client_key -type dns_client -type dns_orig -type port_span -type unix_event -type unix_key egress ../../../bpf/egress.c -- -I../../../bpf/include -O2 -g -Wall -Werror
