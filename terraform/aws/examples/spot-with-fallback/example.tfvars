vpc_id               = "vpc-0123456789abcdef0"
private_subnet_ids   = ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]
driver_ami_id        = "ami-0123456789abcdef0"
gpu_ami_id           = "ami-0fedcba9876543210"
elasticd_release_url = "https://example.com/elasticd/releases/v1.0.0/elasticd-linux-amd64.tar.gz"
