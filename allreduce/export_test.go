package allreduce

// Neighbours exposes, to the black-box tests, which ranks connect to which.
var Neighbours = neighbours

// ShmSupported says whether ranks on one machine use shared memory by default here.
const ShmSupported = shmSupported
