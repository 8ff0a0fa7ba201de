package allreduce

var shmOn = map[bool]int{true: 1}[shmSupported]
