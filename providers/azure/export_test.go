package azure

// GPUSizes is how many sizes the GPU table holds, for the test that holds the docs to it.
func GPUSizes() int { return len(gpus) }
