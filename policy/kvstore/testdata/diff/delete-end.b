rules:
  - name: a
    key: [tenant]
    limit: 10
