package tail

import "syscall"

var syscallECONNREFUSED error = syscall.ECONNREFUSED
