rules:
  - name: a
    key: [tenant]
    limit: 20
    period: 1s
