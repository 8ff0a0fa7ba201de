resource_group_id    = "0123456789abcdef0123456789abcdef"
vpc_id               = "r006-00000000-0000-0000-0000-000000000000"
subnet_id            = "0717-00000000-0000-0000-0000-000000000000"
ssh_key_ids          = ["r006-00000000-0000-0000-0000-000000000001"]
driver_image_id      = "r006-00000000-0000-0000-0000-000000000002"
gpu_image_id         = "r006-00000000-0000-0000-0000-000000000003"
elasticd_release_url = "https://example.com/elasticd/releases/v1.0.0/elasticd-linux-amd64.tar.gz"
